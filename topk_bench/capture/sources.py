"""Where an allocation comes from: the innermost frame of the user's code on the Python stack.

The user's code is the ``topk_bench.attention`` package, the file of the case's registered implementation
(and feed-forward implementation) and the case's plug-ins: what the person reading a profile wrote or
chose. Not torch, not a library it calls, not the harness. When no such frame is on the stack (the
harness's ``loss = out.mean()``, a workload's own step), the innermost frame of the harness stands in,
so that every storage names a line.

Walking the stack costs a few microseconds per call, a dictionary lookup per frame (each code object is
classified once); it runs only while a case is profiled.
"""

from __future__ import annotations

import importlib.util
import linecache
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from types import FrameType

import topk_bench.attention
from topk_bench.measure import memory
from topk_bench.predict import kernels, trace

# What a code object is, once classified.
_SKIP, _USER, _HARNESS = 0, 1, 2

# The checkout (topk_bench/attention/ is two folders down): profiles name its files relative to it.
PROJECT_ROOT = Path(topk_bench.attention.__file__).resolve().parents[2]
_ATTENTION = str(Path(topk_bench.attention.__file__).resolve().parent) + os.sep
_HARNESS_DIR = str(Path(__file__).resolve().parents[1]) + os.sep  # the topk_bench package
# The observers themselves are no one's source: the trackers, the CUDA kernels' model (its trace places a
# kernel's allocations, its composites take CUDA's branch of a user's call) and this package.
_OBSERVERS = (
    str(Path(__file__).resolve().parent) + os.sep,
    str(Path(memory.__file__).resolve()),
    str(Path(trace.__file__).resolve()),
    str(Path(kernels.__file__).resolve().parent) + os.sep,
)

Where = tuple[str, int]  # (file, line)


def _module_files(module: str) -> list[str]:
    """A plug-in module's file, or its package's directory (every file of the package is the user's)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.origin:
        return []
    origin = str(Path(spec.origin).resolve())
    return [str(Path(origin).parent) + os.sep] if spec.submodule_search_locations else [origin]


def user_files(impls: Iterable[str] = (), plugins: Iterable[str] = ()) -> tuple[str, ...]:
    """The files and directories (ending in a separator) whose frames are the user's: ``topk_bench/attention/``, the
    files that define the named implementations (a plug-in's), and the plug-ins (``.py`` paths or modules)."""
    places = [_ATTENTION]
    for name in impls:
        if name and name in topk_bench.attention.names():
            code = getattr(topk_bench.attention.spec(name).fn, "__code__", None)
            if code is not None:
                places.append(str(Path(code.co_filename).resolve()))
    for plugin in plugins:
        if plugin.endswith(".py") or os.sep in plugin or "/" in plugin:
            places.append(str(Path(plugin).resolve()))
        else:
            places.extend(_module_files(plugin))
    return tuple(dict.fromkeys(places))


class Sources:
    """Finds the innermost user frame (else the innermost harness frame) of the current Python stack."""

    def __init__(self, places: Iterable[str] | None = None):
        self.places = tuple(places) if places is not None else user_files()
        self._kinds: dict[object, int] = {}

    def _classify(self, filename: str) -> int:
        path = os.path.realpath(filename) if not filename.startswith("<") else filename
        if any(path == p or (p.endswith(os.sep) and path.startswith(p)) for p in self.places):
            return _USER
        if path.startswith(_HARNESS_DIR) and not path.startswith(_OBSERVERS):
            return _HARNESS
        return _SKIP

    def here(self, skip: int = 1) -> Where | None:
        """(file, line) of the innermost user frame of the caller's stack, else of the harness, else None."""
        frame: FrameType | None = sys._getframe(skip + 1)
        harness: Where | None = None
        kinds = self._kinds
        while frame is not None:
            code = frame.f_code
            kind = kinds.get(code)
            if kind is None:
                kind = kinds[code] = self._classify(code.co_filename)
            if kind == _USER:
                return code.co_filename, frame.f_lineno
            if kind == _HARNESS and harness is None:
                harness = code.co_filename, frame.f_lineno
            frame = frame.f_back
        return harness

    def is_user(self, filename: str) -> bool:
        return self._classify(filename) == _USER

    def names_user_line(self, source: str) -> bool:
        """Whether a source label (:func:`label`) names a line of the user's code (not the harness's, not ``?``)."""
        file = source.rpartition(":")[0]
        if not file:
            return False
        candidates = [Path(file)] if Path(file).is_absolute() else [PROJECT_ROOT / file, Path.cwd() / file]
        return any(self._classify(str(path)) == _USER for path in candidates)

    def innermost(self, frames: Iterable[Where]) -> Where | None:
        """Of recorded frames, innermost first (a CUDA memory snapshot's), the user's first, else the harness's."""
        harness = None
        for file, line in frames:
            kind = self._classify(file)
            if kind == _USER:
                return file, line
            if kind == _HARNESS and harness is None:
                harness = file, line
        return harness


def label(where: Where | None) -> str:
    """``topk_bench/attention/methods/vanilla.py:42``: the path relative to the project (else to the working
    directory, else absolute) and the line; ``?`` for no frame at all."""
    if where is None:
        return "?"
    path = Path(os.path.realpath(where[0]))
    for root in (PROJECT_ROOT, Path.cwd()):
        try:
            return f"{path.relative_to(root)}:{where[1]}"
        except ValueError:
            continue
    return f"{path}:{where[1]}"


def code_line(source: str) -> str:
    """The text of a source label's line (``topk_bench/attention/methods/vanilla.py:42`` -> ``scores = q @ k...``),
    or ''."""
    file, _, line = source.rpartition(":")
    if not file or not line.isdigit():
        return ""
    path = Path(file) if Path(file).is_absolute() else PROJECT_ROOT / file
    if not path.is_file():
        path = Path.cwd() / file
    text = linecache.getline(str(path), int(line)).split("  #")[0]  # less an inline comment (PEP 8's two spaces)
    return " ".join(text.split())  # one line of text, its spaces collapsed
