"""Run in a fresh process: the tracker's peak against the resident high-water mark (VmHWM).

    MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0 python rss_probe.py IMPL SEQ_LEN

glibc then returns every block of 64 KiB or more to the kernel at free, so
RSS follows live tensor bytes. Prints JSON: the increments above what was live
before the measured iteration (inputs), as the tracker and as the kernel saw them.
"""

import gc
import json
import sys
from pathlib import Path

import torch

import topk_bench.attention
from topk_bench.measure.memory import LiveBytes


def status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def main() -> None:
    name, length = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 12, length, 64, requires_grad=True) for _ in range(3))
    attention = topk_bench.attention.get(name)

    def step() -> None:
        for t in (q, k, v):
            t.grad = None
        out = attention(q, k, v, causal=True, activation="softmax")
        out.mean().backward()
        del out

    # Warm-up, under a tracker too: lazy state (BLAS buffers, thread stacks, and ~60 MB that
    # Python's dispatch machinery allocates once, at its first use) must not land in the measured run.
    with LiveBytes():
        step()
    for t in (q, k, v):
        t.grad = None
    gc.collect()
    tracker = LiveBytes()
    tracker.register(q, k, v)
    rss_before = status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    with tracker:
        step()
    hwm = status_bytes("VmHWM")
    print(
        json.dumps(
            {
                "tracker_bytes": tracker.peak_bytes - tracker.baseline_bytes,
                "rss_bytes": hwm - rss_before,
            }
        )
    )


if __name__ == "__main__":
    main()
