"""Stages of an implementation, marked so that a harness can time and size each one.

An implementation wraps each stage of its work in :func:`stage`::

    from topk_bench.attention.shared.stages import stage

    with stage("indexer"):
        scores = ...
    with stage("selection"):
        top = scores.topk(...)
    with stage("attention"):
        out = ...

Each mark is two things:

- a ``torch.profiler.record_function`` range named ``stage:<name>`` (:data:`PREFIX`), so that any
  profiler trace (``topk-bench profile``'s ``trace.json``, a user's own ``torch.profiler`` run) shows
  the stages by name;
- a call to every listener registered with :func:`listening` on entering and on leaving the stage:
  ``listener(name, entering)``. A harness measures each stage from there (its time, the peak of live
  memory inside it). With no listener the cost is one list check and the ``record_function`` (a no-op
  unless a profiler runs).

Forward or backward is not part of the name: a listener tells them apart by whether autograd is running a
backward node (``torch._C._current_autograd_node()``), so an implementation marks its backward's stages with
the same names. Stages may nest (a listener sees them as a stack); the conventional names are
:data:`STAGES`, and an implementation declares the ones it marks in its registry entry (``stages``).

This module imports nothing of any harness: an implementation taken alone still runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

PREFIX = "stage:"

# The conventional stage names: scoring keys cheaply (a lightning indexer; NSA's compressed blocks),
# choosing the keys (top-k, top-n blocks), attending the chosen keys exactly, and an auxiliary loss.
INDEXER = "indexer"
COMPRESSION = "compression"
SELECTION = "selection"
ATTENTION = "attention"
INDEXER_LOSS = "indexer_loss"
STAGES = (INDEXER, COMPRESSION, SELECTION, ATTENTION, INDEXER_LOSS)

Listener = Callable[[str, bool], None]

_listeners: list[Listener] = []


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Mark the enclosed work as stage ``name`` (a profiler range ``stage:<name>``; listeners told)."""
    if torch.compiler.is_compiling():  # a compiled graph fuses across stages (and dynamo would warn of the range)
        yield
        return
    if not _listeners:
        with torch.profiler.record_function(PREFIX + name):
            yield
        return
    listeners = tuple(_listeners)
    for listener in listeners:
        listener(name, True)
    try:
        with torch.profiler.record_function(PREFIX + name):
            yield
    finally:
        for listener in reversed(listeners):
            listener(name, False)


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[Listener]:
    """Call ``listener(name, entering)`` at every stage's start and end while inside this block."""
    _listeners.append(listener)
    try:
        yield listener
    finally:
        _listeners.remove(listener)


def in_backward() -> bool:
    """Whether autograd is running a backward node now (a stage entered here is a backward stage)."""
    return torch._C._current_autograd_node() is not None
