"""Runs the doctor's checks for a device, CPU checks first; CUDA's when asked for and available."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from topk_bench.doctor.check import Check, Result
from topk_bench.types import DeviceKind


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Tiny tensors: on a loaded machine a second OpenMP thread costs far more than it saves."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def diagnose(
    device: str = "cpu",
    *,
    plugins: tuple[str, ...] = (),
    isolated: tuple[str, ...] = (),
    progress: Callable[[Check], None] | None = None,
    plugin_seconds: float | None = None,
) -> list[Check]:
    """Every check for ``device`` ("cpu" or "cuda"); on a machine without CUDA, ``cuda`` is one skipped row.

    ``plugins``: modules or files (already imported here, :func:`topk_bench.plugins.resolve`) whose
    implementations are judged with the rest; ``isolated``: those of their implementations judged in a
    process of their own (:mod:`.isolated`: user code may exit or hang), each within ``plugin_seconds``
    (:data:`.isolated.LIMIT_S` when None); ``progress`` sees each check as it ends.
    """
    import torch

    # probes is imported for its side effect: it registers the doctor's own implementations here.
    from topk_bench.doctor import agreement, cuda, native, oom, peaks, probes, timer  # noqa: F401 -- probes
    from topk_bench.doctor import isolated as apart

    found: list[Check] = []

    def note(checks: list[Check]) -> None:
        for c in checks:
            found.append(c)
            if progress:
                progress(c)

    if DeviceKind.of(device) is DeviceKind.CUDA and not torch.cuda.is_available():
        note([Check("cuda", Result.SKIPPED, "CUDA is not available on this machine: ran the CPU checks")])
        device = "cpu"
    oom_checks = oom.start(device)  # children in the background while this process checks the rest
    with _one_thread():
        note(agreement.checks(device, skip=isolated))
        note(peaks.checks(device, plugins, skip=isolated))
        note(apart.checks(list(isolated), device, plugins, limit_s=plugin_seconds))
        note(oom_checks())
        if DeviceKind.of(device) is DeviceKind.CUDA:
            note([cuda.check(device)])
        else:
            note([Check("TF32 off while measuring", Result.SKIPPED, "CUDA only (no TF32 on the CPU)")])
        note([timer.check(device)])
        note(native.checks(device))
    return found
