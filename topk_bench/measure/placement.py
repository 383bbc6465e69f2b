"""Device placement: every op's tensors on one device, and (in the measured region) on the case's device.

An implementation that mixes a CPU tensor with one on the model's device fails every
case on CUDA, and nothing on a CPU-only machine sees it. :class:`DevicePlacement` is a ``TorchDispatchMode`` that looks
at every aten
op below autograd (forward and backward alike) and records each one whose tensor
arguments or results sit on more than one device. With ``expected`` set it also
records any op that reads or makes a tensor elsewhere: in the measured iteration
nothing should run off the device (a host round trip on CUDA is a synchronisation
and, on the meta device, a crash).

Allowed, as CUDA allows them: 0-dim CPU tensors (scalars, such as ``torch.tensor(2.0)``
beside a CUDA tensor), and the explicit transfers ``_to_copy`` / ``copy_`` (building on the CPU
and then moving, as Performer's random features do on purpose, is not a bug).

Run on the ``meta`` device (no data, no GPU needed), it catches on a CPU-only machine
what would fail on a GPU; the tests do that for every implementation and workload,
and ``topk-bench doctor`` runs it on the real device.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# Ops whose job is to move data between devices.
_TRANSFERS = frozenset({torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default})


def _counts(tensor: torch.Tensor) -> bool:
    """Whether a tensor's device matters: a 0-dim CPU tensor is a (wrapped) scalar, legal beside any device."""
    return not (tensor.device.type == "cpu" and tensor.dim() == 0)


class DevicePlacement(TorchDispatchMode):
    """Records ops that mix devices, or (with ``expected``) touch any device but ``expected``.

    ``problems`` holds one line per offending op (the first few of each kind);
    :meth:`check` raises ``AssertionError`` listing them.
    """

    def __init__(self, expected: str | torch.device | None = None, *, keep: int = 5):
        super().__init__()
        self.expected = torch.device(expected).type if expected is not None else None
        self.keep = keep
        self.problems: list[str] = []
        self.ops = 0

    def _note(self, line: str) -> None:
        if line not in self.problems and len(self.problems) < self.keep:
            self.problems.append(line)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        if func in _TRANSFERS:
            return func(*args, **kwargs)
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and _counts(t)]
        self._judge(func, inputs)  # before the call: an op that mixes devices often raises, unnamed
        out = func(*args, **kwargs)
        self._judge(func, inputs + [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and _counts(t)])
        return out

    def _judge(self, func, tensors: list[torch.Tensor]) -> None:
        devices = sorted({str(t.device) for t in tensors})
        if len(devices) > 1:
            self._note(f"{func} mixes devices {', '.join(devices)}")
        elif self.expected is not None and devices and torch.device(devices[0]).type != self.expected:
            self._note(f"{func} runs on {devices[0]}, not on {self.expected}")

    def check(self) -> None:
        if self.problems:
            raise AssertionError("device placement: " + "; ".join(self.problems))
