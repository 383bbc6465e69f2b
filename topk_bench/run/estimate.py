"""How long a run will take: a typical time to plan by, and the bound its budgets set.

Each case is expected to take what an earlier run of the same case on this machine took (its row's
``wall_s``), else what its cost model says (:func:`case_seconds`): a prediction costs a little per aten op
the fake iteration dispatches, a measurement its iterations at the machine's rates over the case's FLOPs and
bytes (its workload's ``traffic``, the same cost model as the rate columns) plus a fixed start. The run's
time is those cases laid out in the order they run on its job slots (:func:`makespan`). The bound is every
case using its whole time budget.

Cases that share the machine's cores with each other and with other processes (``threads`` per job slot, the
cores others keep busy when the run starts) take longer alike (:func:`slowdown`).

The constants were fitted to runs of suites/demo_memory.toml, mha.toml, decode.toml, decoder.toml (``--predict``),
demo_time.toml, and mha.toml, decode.toml and kv_selection.toml at CPU sizes (``--set``), on 2 cores of an
AVX-512-BF16 EPYC shared with other work (1-minute load 1.1 to 2.7 per core, 1.3 at the median), each row's
seconds divided by that load (``scripts/calibrate_estimates.py`` fits them again from any results CSV with
``wall_s``); an AVX2-only CPU may take up to twice as long. While the run goes, the progress bar's time left
scales the cost model by what the cases done took (:class:`topk_bench.run.progress.Eta`).
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from topk_bench import workloads
from topk_bench.case import Case
from topk_bench.measure.iterations import compiles, loops_for, own_timing_pass
from topk_bench.protocol import PAPER
from topk_bench.results import columns as col
from topk_bench.suite.settings import ExecutorSettings
from topk_bench.types import DEFAULT_GPU, DeviceKind
from topk_bench.units import format_duration, missing

# A new interpreter importing torch (the local template, once; each Slurm task): 2 to 5 s on 2 loaded cores.
INTERPRETER_S = 3.0
# A child forked from the warm template, before it measures (benchmarks/harness/bench_child_overhead.py: tens of ms).
FORK_S = 0.25

# -- the cost model's constants (module docstring: how they were fitted) ------------------------------------
# Aten ops of one attention call, set from the rows' ops_per_iter: a fixed part (an MHA layer's vanilla or SDPA:
# 97 to 135) and a part per query chunk past the first (``chunk_size``: a chunked method loops), qchunk's and
# topk's 93 to 96; what an implementation of this project dispatches otherwise, by its registry name: Performer's
# ~35 (chunks of 512), topk_fast's 370 at 16 chunks to 480 at 64 (it tiles the keys of each chunk too).
OPS_PER_CALL = 100
OPS_PER_CHUNK = 95
OPS_PER_CHUNK_OF = {"performer": 35, "topk_fast": 450}
# A predicted case: the child's start, the build and tracing besides the ops; then each op of the fake
# iterations (counted and plain, under FakeTensorMode).
PREDICT_CASE_S = 0.15
PREDICT_OP_S = 3.0e-4
# A measured case besides its iterations: the child's start, the build, the numbers checked after.
MEASURED_CASE_S = 0.45
# One iteration's host time per op outside the kernels, and in the profiling iteration (its dispatch modes).
OP_S = 1.4e-4
PROFILE_OP_S = 2.4e-4
# The CPU's rate per thread over the cost model's FLOPs; its bandwidth over the bytes (the fit gives the bytes
# no weight beside the FLOPs on these runs: a socket's 50 GB/s, so that a bandwidth-bound case still counts).
CPU_FLOPS_PER_THREAD = 4.0e10
CPU_BYTES_PER_S = 5.0e10
# The first call of a case that compiles (flex, compile = true): torch.compile's time (the median compile_s).
COMPILE_S = 6.7
# Each kind of selection quality a case computes after its timed iterations (quality = [...]).
QUALITY_S = 1.6


@dataclass(frozen=True)
class Estimate:
    """How long ``n`` cases take: ``typical_s`` (about), ``bound_s`` (at most); ``per_case``: case_id -> the
    seconds each is expected to take (one round); ``known``: how many of them from earlier rows."""

    n: int
    typical_s: float
    bound_s: float
    at_once: int
    budget_s: float
    per_case: dict[str, float] = field(default_factory=dict)
    known: int = 0

    def text(self) -> str:
        """``about 40 s, at most 12 min (2 at a time, each within its 300 s time budget)``."""
        earlier = f"; {self.known} of {self.n} case(s) as they took here before" if self.known else ""
        return (
            f"about {format_duration(self.typical_s)}, {bound_text(self.bound_s, self.at_once, self.budget_s)}{earlier}"
        )


def bound_text(bound_s: float, at_once: int, budget_s: float) -> str:
    return f"at most {format_duration(bound_s)} ({at_once} at a time, each within its {budget_s:g} s time budget)"


def at_most(n: int, budget_s: float | None, executor: ExecutorSettings) -> str:
    """The bound of ``n`` cases in words: what a suite of more than ``max_cases`` may take."""
    return bound_text(bound(n, budget_s, executor), slots(executor), budget_s or 0.0)


def slots(executor: ExecutorSettings) -> int:
    """Cases at once: the local job slots, or Slurm's array parallelism."""
    return executor.jobs if executor.kind == "local" else executor.array_parallelism


def _start(executor: ExecutorSettings) -> tuple[float, float]:
    """(once, per case): locally one template starts, then each case is a fork; a Slurm task starts an
    interpreter of its own."""
    return (INTERPRETER_S, 0.0) if executor.kind == "local" else (0.0, INTERPRETER_S)


def bound(n: int, budget_s: float | None, executor: ExecutorSettings) -> float:
    """Every one of ``n`` cases using its whole time budget."""
    once, each = _start(executor)
    return once + math.ceil(n / slots(executor)) * (each + FORK_S + (budget_s or 0.0))


def chunks(case: Case, query_tokens: int) -> int:
    """Query chunks of one attention call: a method with a ``chunk_size`` loops over them."""
    size = case.option_dict.get("chunk_size")
    return max(1, math.ceil(query_tokens / size)) if isinstance(size, int) and size > 0 else 1


def ops(case: Case, traffic: workloads.Traffic | None) -> float:
    """Aten ops one iteration of ``case`` dispatches, about (its ``ops_per_iter`` once run): per attention call
    a fixed part and a part per query chunk past the first; a model of ``layers`` calls as many."""
    query = traffic.tokens_per_sequence if traffic is not None else 1
    calls = case.param_dict.get("layers", 1)
    calls = calls if isinstance(calls, int) and calls > 0 else 1
    return calls * (OPS_PER_CALL + OPS_PER_CHUNK_OF.get(case.impl, OPS_PER_CHUNK) * (chunks(case, query) - 1))


def cuda_iteration_seconds(case: Case, traffic: workloads.Traffic | None, op_count: float) -> float:
    """One eager iteration on a GPU, by the GPU time model's fitted constants (topk_bench.predict.timing) on the
    part a CUDA prediction models by default (the H100 the constants were fitted on): the cost model's FLOPs at
    the GEMMs' achieved rate for the dtype, its bytes at the elementwise kernels' bandwidth, and the host's
    launches (every op counted as one: an upper bound); the slower of device and host."""
    from topk_bench.aten_ops import KernelClass
    from topk_bench.predict import timing  # the kernel rules and the catalogue: only for a CUDA run
    from topk_bench.predict.kernels.gpus import gpu

    part, constants = gpu(DEFAULT_GPU), timing.Constants.fitted()
    peak = timing.peak_flops(part, "half" if case.dtype.half else "float32", KernelClass.GEMM)
    device = (
        traffic.flops / (peak * constants.efficiency[KernelClass.GEMM])
        + traffic.bytes / (part.hbm_bytes_per_s * constants.efficiency[KernelClass.ELEMENTWISE])
        if traffic is not None
        else 0.0
    )
    return max(device, op_count * (constants.op_s + constants.launch_s))


def iteration_seconds(case: Case, traffic: workloads.Traffic | None, op_count: float) -> float:
    """One eager iteration of a measured case: its FLOPs and bytes at the device's rates, and its ops' host time."""
    if DeviceKind(case.device) is DeviceKind.CUDA:
        return cuda_iteration_seconds(case, traffic, op_count)
    rates = (CPU_FLOPS_PER_THREAD * max(1, case.threads or 1), CPU_BYTES_PER_S)
    work = (traffic.flops / rates[0] + traffic.bytes / rates[1]) if traffic is not None else 0.0
    return work + op_count * OP_S


def iterations(case: Case, iteration_s: float) -> float:
    """Iterations a measured case runs (:mod:`topk_bench.measure.iterations`): the profiling one, the warm-up
    (by count and by time), the untimed one after the reset, the timed ones (``loops`` a sample; twice with a
    timing pass)."""
    if case.protocol == PAPER.name:
        return case.repeats + 1
    warm_up = max(case.warmup - 1, case.warmup_s / iteration_s if iteration_s > 0 else 0.0, 0.0)
    timed = case.repeats * loops_for(case.min_sample_s, iteration_s) * (2 if own_timing_pass(case) else 1)
    return 1 + warm_up + 1 + timed


def case_seconds(case: Case) -> float:
    """What one run of ``case`` takes here by the cost model, its child's start included (no earlier row)."""
    traffic = workloads.traffic(case)
    op_count = ops(case, traffic)
    if case.predicted:
        return PREDICT_CASE_S + PREDICT_OP_S * op_count
    iteration = iteration_seconds(case, traffic, op_count)
    first = COMPILE_S if compiles(case) else 0.0
    after = QUALITY_S * len(case.quality)
    return MEASURED_CASE_S + first + after + iterations(case, iteration) * iteration + PROFILE_OP_S * op_count


def earlier(rows: Iterable[Mapping[str, Any]], here: Mapping[str, str]) -> dict[str, float]:
    """case_id -> the median ``wall_s`` of its earlier rows run on this machine (``here``: the machine columns
    as this machine fills them, e.g. ``cpu_capability``; a row that names another in one of them is not)."""
    walls: dict[str, list[float]] = {}
    for row in rows:
        wall = row.get(col.WALL_S)
        if missing(wall) or any(not missing(row.get(k)) and str(row.get(k)) != v for k, v in here.items()):
            continue
        try:
            walls.setdefault(str(row[col.CASE_ID]), []).append(float(wall))  # type: ignore[arg-type]
        except (TypeError, ValueError, KeyError):
            continue
    return {case_id: statistics.median(values) for case_id, values in walls.items()}


def slowdown(executor: ExecutorSettings, threads: int, busy: float | None, cores: int) -> float:
    """How much slower each case runs here than alone: the job slots' threads and the cores other processes keep
    busy (``busy``) share ``cores``; on Slurm, each job has its own."""
    if executor.kind != "local" or busy is None or cores < 1:
        return 1.0
    return max(1.0, (busy + executor.jobs * max(1, threads)) / cores)


def makespan(seconds: list[float], at_once: int) -> float:
    """The cases laid out in order on ``at_once`` slots, each starting when a slot is free: when the last ends."""
    free = [0.0] * max(1, at_once)
    for s in seconds:
        heapq.heapreplace(free, free[0] + s)
    return max(free)


def estimate(
    cases: list[Case],
    executor: ExecutorSettings,
    budget_s: float | None,
    *,
    rounds: int = 1,
    before: Mapping[str, float] | None = None,
    slower: float = 1.0,
) -> Estimate:
    """How long ``cases`` take on ``executor`` (``rounds`` each); ``before``: case_id -> seconds an earlier
    run of it took here (:func:`earlier`); ``slower``: the cost model's seconds times this (:func:`slowdown`:
    the machine shared now), an earlier run's as they were.

    A case takes at most its time budget (it is stopped there: a ``timeout`` row), so no case is expected to
    take longer, and the typical time never exceeds the bound ("about 30.4 min, at most 1.05 min" was a cost
    model's 30 min for cases stopped after 60 s)."""
    before = before or {}
    longest = budget_s + FORK_S if budget_s else math.inf
    per_case = {
        c.case_id: min(before[c.case_id] if c.case_id in before else case_seconds(c) * slower, longest) for c in cases
    }
    once, each = _start(executor)
    typical = once + makespan([(per_case[c.case_id] + each) * rounds for c in cases], slots(executor))
    return Estimate(
        n=len(cases) * rounds,
        typical_s=typical,
        # Rounds of one case laid out on one slot can end past every-case-uses-its-budget spread over all slots.
        bound_s=max(bound(len(cases) * rounds, budget_s, executor), typical),
        at_once=slots(executor),
        budget_s=budget_s or 0.0,
        per_case=per_case,
        known=sum(c.case_id in before for c in cases),
    )
