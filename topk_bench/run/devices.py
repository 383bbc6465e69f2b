"""Which GPU each local job slot runs its cases on (measured CUDA runs; pure functions).

Cases that share a GPU corrupt each other's times and peaks, so ``--jobs N`` on
CUDA gives job slot ``i`` the GPU ``i mod count`` of those this process sees,
through the child's ``CUDA_VISIBLE_DEVICES`` (the child then sees it as
``cuda:0``). The variable is read when CUDA initialises, which happens in the
child after the fork (:mod:`topk_bench.child.template`), so one template
serves every slot. With one GPU a measured run keeps one job (the plan says so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

VISIBLE = "CUDA_VISIBLE_DEVICES"


def visible_gpus(environ: Mapping[str, str], count: int) -> list[str]:
    """The GPUs this process sees, as ``CUDA_VISIBLE_DEVICES`` entries: its own list (CUDA stops at
    the first invalid entry, which ``count``, torch's device count, reflects), else ordinals 0..count-1."""
    if count <= 0:
        return []
    listed = environ.get(VISIBLE)
    if listed is None:
        return [str(i) for i in range(count)]
    return [entry.strip() for entry in listed.split(",") if entry.strip()][:count]


def slot_environments(jobs: int, gpus: Sequence[str]) -> list[dict[str, str]] | None:
    """Per job slot, the variables its children get: slot i -> GPU i mod count. None when there is
    no choice to make (fewer than two GPUs): children keep this process's own setting."""
    if len(gpus) < 2:
        return None
    return [{VISIBLE: gpus[slot % len(gpus)]} for slot in range(jobs)]
