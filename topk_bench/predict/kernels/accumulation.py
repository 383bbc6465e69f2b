"""Gradient accumulation in the autograd engine: in place on CUDA, out of place in the fake run.

When two gradients reach the same input of a node, ``InputBuffer::accumulate``
(torch/csrc/autograd/input_buffer.cpp) adds them: ``old.add_(new)`` when ``can_accumulate_inplace(old)``
(a dense tensor the buffer holds the last reference to, and not a tensor subclass), else ``new.add_(old)``
when the new one qualifies, else ``old + new``. Fake tensors are tensor subclasses, so the fake run always
takes the last branch and allocates a gradient CUDA does not.

:class:`EngineAdds` tells those additions apart from a node's own: a post hook on every node of the graph
being differentiated records the node that has just finished; an ``add.Tensor`` the engine issues while
that node is still current is the input buffer's. The trace then checks which operand the buffer held
the last reference to (its storage is freed right after the addition) and, for a dense one, replays the
addition in place: the sum keeps that operand's allocation.
"""

from __future__ import annotations

import torch
from torch.autograd.graph import Node

ADD = torch.ops.aten.add.Tensor


class EngineAdds:
    """Which nodes of the graphs being differentiated have finished their ``apply``."""

    def __init__(self) -> None:
        self.finished: Node | None = None  # the node whose apply returned last (its grads are being routed now)

    def _done(self, grad_inputs, grad_outputs) -> None:
        self.finished = torch._C._current_autograd_node()

    def hook(self, roots) -> None:
        """A post hook on every node reachable from the ``grad_fn`` of the tensors ``roots``."""
        seen: set[Node] = set()
        stack: list[Node | None] = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            node.register_hook(self._done)
            stack.extend(next_node for next_node, _ in node.next_functions)

    def is_accumulation(self, func, args, kwargs) -> bool:
        """``func(*args, **kwargs)`` is the engine's ``old + new`` of two gradients."""
        if func is not ADD or kwargs or len(args) != 2 or self.finished is None:
            return False
        return torch._C._current_autograd_node() is self.finished and all(isinstance(a, torch.Tensor) for a in args)
