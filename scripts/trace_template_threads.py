"""Where does the warm template gain a thread? (It may only fork with one: topk_bench/child/template.py.)

Runs what the template runs before its first fork -- its imports, the fork-safe environment, the warm-up
prediction at start and the one before a case of each implementation named -- under a profile hook that counts this
process's threads after every call into C, and prints the Python stack of the first call that left more
threads than before (with the new threads' names), or says that none did.

    python scripts/trace_template_threads.py [IMPL ...]      # default: vanilla
Exit status: 0 the warm-up kept one thread, 1 a call added one (its stack printed).
"""

from __future__ import annotations

import os
import sys
import traceback


def tasks() -> dict[str, str]:
    names = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as fh:
                names[task] = fh.read().strip()
        except OSError:
            names[task] = "?"
    return names


def driver_initialised() -> str:
    """Whether this process initialised the CUDA driver, by anyone (torch, NVML, triton): cuDeviceGetCount answers
    CUDA_ERROR_NOT_INITIALIZED (3) before cuInit, and initialises nothing itself."""
    import ctypes

    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no libcuda"
    count = ctypes.c_int(0)
    code = libcuda.cuDeviceGetCount(ctypes.byref(count))
    return "no" if code == 3 else f"yes (cuDeviceGetCount: {code}, {count.value} device(s))"


def main(impls: list[str]) -> int:
    import torch

    from topk_bench.child.template import settle

    settle()  # as the template does before each fork: pools that stop for a fork (OpenBLAS's) stop now
    before = tasks()
    print(f"after import torch: {len(before)} thread(s) {sorted(before.values())}", flush=True)
    found: list[str] = []

    def hook(frame, event, arg):
        nonlocal before
        if event != "c_return" or found or len(os.listdir("/proc/self/task")) <= len(before):
            return
        now = tasks()
        if len(now) > len(before):
            new = sorted(name for task, name in now.items() if task not in before)
            found.append(
                f"{getattr(arg, '__qualname__', arg)!r} started thread(s) {new}, called from:\n"
                + "".join(traceback.format_stack(frame))
            )
        before = now

    sys.setprofile(hook)
    try:  # what the template does before its first fork: its imports, its environment, its warm-up
        from topk_bench.child import template
        from topk_bench.child.worker import WarmUp

        os.environ.update(template.FORK_SAFE_ENVIRONMENT)
        warm = WarmUp()
        warm.start()
        for impl in impls:
            warm._predict(impl)
    finally:
        sys.setprofile(None)
    settle()
    after = tasks()
    print(
        f"after the warm-up: {len(after)} thread(s) {sorted(after.values())}; CUDA initialised by torch: "
        f"{torch.cuda.is_initialized()}; fork hazard: {template.fork_hazard() or 'none'}; the CUDA driver "
        f"initialised: {driver_initialised()}"
    )
    if found:
        print(found[0])
    elif len(after) > 1:
        print("a thread appeared outside any call into C from Python (from another thread, say)")
    return 1 if found or len(after) > 1 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["vanilla"]))
