"""What the warm template (:mod:`.template`) runs before it forks, so that its children do not each pay it."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch

from topk_bench import attention
from topk_bench.case import Case
from topk_bench.child.execute import execute
from topk_bench.status import Status
from topk_bench.types import Method, Mode


def backward_may_run_before_fork() -> bool:
    """A build without accelerators: the autograd engine's first run starts no thread.

    In a CUDA (or XPU) build it counts the devices, which initialises the driver, and starts
    a thread per device (on an H100: ``cuda00001800007``, ``pt_autograd_0``): a template
    with threads cannot fork, so there its warm-up stays forward-only and each child pays
    its own first backward (about 40 ms of a predicted case here).
    """
    return not torch.backends.cuda.is_built() and not getattr(torch._C, "_has_xpu", False)


@contextlib.contextmanager
def _cuda_asked_of_nobody():
    """``torch.cuda.is_available()`` answered by the build alone while the template warms up.

    ``FakeTensorMode`` asks it on entering, and in a CUDA build every way torch answers it leaves the
    template unable to fork: the driver (``cudaGetDeviceCount``) initialises CUDA; NVML
    (``PYTORCH_NVML_BASED_CUDA_CHECK=1``) starts a thread (an H100 with driver 580: ``cuda00001800007``,
    from ``nvmlInit``); and a "no" (the GPUs hidden) makes ``FakeTensorMode`` ask the CUDA device guard
    for its device count, which initialises the driver. The warm-up predicts on the CPU, where the
    answer changes nothing but that; the children ask torch itself.
    """
    asked = torch.cuda.is_available
    torch.cuda.is_available = lambda: torch.backends.cuda.is_built()
    try:
        yield
    finally:
        torch.cuda.is_available = asked


def _warm_up_case(impl: str) -> Case:
    spec = attention.spec(impl)
    mode = Mode.FWD_BWD if backward_may_run_before_fork() else Mode.FWD
    return Case.make(
        suite="warm-up",
        workload="mha",
        impl=impl,
        method=Method.PREDICTED,
        mode=mode,
        causal=spec.causal,
        activation=spec.activations[0],
        params={"seq_len": 16, "d_model": 16, "heads": 2},
        warmup=0,
        repeats=1,
    )


class WarmUp:
    """What the template runs before forking, so that children do not each pay it.

    At start, a tiny prediction: the first one imports torch._dynamo and sympy
    (seconds). Before the first child of each built-in implementation, a tiny
    prediction of it (its own modules: performer-pytorch, its first dispatches).
    Predictions only (forward-only in a CUDA build: :func:`backward_may_run_before_fork`), on the
    CPU: fake tensors touch no CUDA and run no kernel
    (but for the few ops FakeTensorMode runs for real on zeros, which run on one
    thread here). Plug-ins are never imported here: each child imports its own.
    """

    def __init__(self) -> None:
        self.done: set[str] = set()

    def start(self) -> None:
        self._predict("vanilla")

    def before(self, argv: list[str]) -> None:
        try:
            case = Case.from_json(Path(argv[0]).read_text())
        except Exception:  # noqa: BLE001 -- the child reads the same file and reports the problem
            return
        for impl in (case.impl, case.ff_impl):
            if impl:
                self._predict(impl)

    def _predict(self, impl: str) -> None:
        """A tiny prediction of ``impl``, once; nothing for a plug-in's or an unpredictable one."""
        if impl in self.done or impl not in attention.names() or not attention.spec(impl).predictable:
            return
        self.done.add(impl)
        # One thread: a fake op the tracker cannot size runs for real on zeros (FakeTensorMode's
        # fallback, e.g. torch.sparse), and a parallel region would leave an OpenMP pool behind.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with _cuda_asked_of_nobody():
                result = execute(_warm_up_case(impl))
        finally:
            torch.set_num_threads(threads)
        if result.status != Status.OK:  # costs each child the imports it would have shared, nothing else
            print(
                f"topk-bench template: warm-up prediction of {impl} failed: {result.error}", file=sys.stderr, flush=True
            )
