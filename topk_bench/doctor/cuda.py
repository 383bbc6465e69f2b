"""CUDA's numerics while measuring: TF32 off (the paper's setting), whatever the process had set before."""

from __future__ import annotations

import torch

from topk_bench.case import Budget
from topk_bench.child.execute import measure
from topk_bench.doctor import probes, tiny
from topk_bench.doctor.check import Check


def check(device: str) -> Check:
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = matmul.allow_tf32, cudnn.allow_tf32
    matmul.allow_tf32 = cudnn.allow_tf32 = True  # as a user's script might leave them
    probes.SEEN.clear()
    try:
        result = measure(tiny.case("doctor_numerics", device=device, plugins=(probes.MODULE,)), Budget())
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = before
    if not probes.SEEN:
        return Check.judged(
            "TF32 off while measuring", False, f"the probe did not run ({result.status}: {result.error})"
        )
    seen = probes.SEEN[-1]
    passed = not seen["matmul.allow_tf32"] and not seen["cudnn.allow_tf32"]
    return Check.judged(
        "TF32 off while measuring",
        passed,
        ", ".join(f"{k}={v}" for k, v in seen.items()) + " (set to True before the case)",
    )
