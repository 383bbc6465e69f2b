"""Simulate topk_select_kernel's walk on random scores, in torch on the CPU: the candidates a row appends and the
cuts a 16-row tile makes (docs/triton.md, "The exact top-k"). The kernel's rules: blocks of 64 keys from the
diagonal back, a key appended when it beats its row's threshold, every row cut to its top-k when a block would
overflow some row's buffer of CAP keys: in the kernel to between k and ``(k + CAP - 64) // 2`` keys (a loose cut);
simulated both ways, to exactly k (the fewest cuts) and to ``keep`` keys (the most), the threshold then the kept
set's lowest key.

    .venv/bin/python scripts/simulate_select_walk.py
"""

from __future__ import annotations

import math

import torch


def walk(
    n: int, dtype: torch.dtype, keep: int, k: int = 128, block: int = 64, cap: int = 256, rows: int = 16
) -> tuple[float, int]:
    """(candidates appended a row, cuts) for one tile of ``rows`` query rows walking ``n`` keys (d = 64)."""
    g = torch.Generator().manual_seed(0)
    scores = (torch.randn(rows, 64, generator=g) @ torch.randn(64, n, generator=g) / 8).to(dtype).double()
    key = scores * 2**20 - torch.arange(n, dtype=torch.float64) * 2**-20  # ties to the lowest key (order only)
    threshold = torch.full((rows,), -math.inf, dtype=torch.float64)
    held = [torch.empty(0, dtype=torch.float64) for _ in range(rows)]
    appended = cuts = 0
    for start in range(n - block, -1, -block):
        keys = key[:, start : start + block]
        hit = keys > threshold[:, None]
        if not hit.any():
            continue
        if max(len(h) + int(m.sum()) for h, m in zip(held, hit)) > cap:
            cuts += 1
            for r in range(rows):
                if len(held[r]) >= k:
                    held[r] = held[r].topk(min(keep, len(held[r]))).values
                    threshold[r] = held[r].min()
            hit = keys > threshold[:, None]
        for r in range(rows):
            held[r] = torch.cat([held[r], keys[r][hit[r]]])
        appended += int(hit.sum())
    return appended / rows, cuts


def main() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        for n in (16384, 65536):
            estimate = 128 * (1 + math.log(n / 128))
            for keep in (128, (128 + 256 - 64) // 2):
                per_row, cuts = walk(n, dtype, keep)
                print(
                    f"{dtype} n={n} cut to {keep}: {per_row:.0f} candidates a row "
                    f"(k (1 + ln(n/k)) = {estimate:.0f}), {cuts} cuts"
                )


if __name__ == "__main__":
    main()
