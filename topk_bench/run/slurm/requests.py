"""What each case's Slurm job asks for, and whether the partition can ever give it (before anything is submitted).

A case asks what it needs, not bench.toml's defaults for every job:

- a prediction: one CPU (it computes nothing: fake tensors, one thread) and :data:`PREDICTION_MEM_GB`;
- a CPU measurement: the threads it runs with (``threads``, ``run/resolve.py``) and ``mem_gb``;
- a CUDA measurement: the same, and ``gpus_per_node`` GPUs (its device).

:func:`check` compares the requests of a run with the partition's nodes (``sinfo``) and its per-node
limits (``scontrol show partition``): a request no node can satisfy would pend forever (or be refused
by sbatch with a vaguer message), so the run stops first, naming what was asked and what the partition
offers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from topk_bench.case import Case
from topk_bench.errors import BadInput
from topk_bench.run.slurm.jobs import command
from topk_bench.types import DeviceKind

# A prediction job's processes (the job's own, the warm template that imported torch, the forked case)
# peaked at 0.8 GB of resident memory, summed, for the largest cases of suites/mha.toml and decode.toml.
PREDICTION_MEM_GB = 2.0


@dataclass(frozen=True, order=True)
class Request:
    """What one job asks of a node."""

    cpus: int
    mem_mb: int
    gpus: int = 0

    def describe(self, gpus_too: bool = False) -> str:
        """``4 CPUs, 64.0 GiB of memory`` (and the GPUs, when there are any or ``gpus_too``)."""
        gpus = f" and {self.gpus} GPU{'s' if self.gpus != 1 else ''}" if self.gpus or gpus_too else ""
        return f"{self.cpus} CPU{'s' if self.cpus != 1 else ''}, {self.mem_mb / 1024:.1f} GiB of memory{gpus}"


def needs_gpu(case: Case) -> bool:
    """Whether the case's job must be given a GPU: measured on CUDA. Predicting and CPU cases need none
    (and a cluster without GPUs configured refuses a job that asks for one)."""
    return case.measured_on(DeviceKind.CUDA)


def request(case: Case, settings) -> Request:
    """What ``case``'s job asks for (``settings``: bench.toml's ``[executor]``)."""
    if case.predicted:
        return Request(1, int(PREDICTION_MEM_GB * 1024))
    gpus = settings.gpus_per_node if needs_gpu(case) else 0
    return Request(case.threads or settings.cpus_per_task, max(1, int(settings.mem_gb * 1024)), gpus)


def sbatch_parameters(settings, asked: Request, name: str = "topk-bench") -> dict[str, Any]:
    """submitit's SlurmExecutor parameters of the jobs that ask ``asked``, from ``ExecutorSettings``.

    ``timeout_min`` is the Slurm time limit of each case's job: a backstop above the per-case budget,
    which the child process in the job enforces as locally. Jobs are not requeued (``--no-requeue``): a
    job lost with its node or preempted becomes a row that says so, and a resume runs it again, so that
    no case is ever measured twice behind the run's back.
    """
    params: dict[str, Any] = {
        "job_name": name,
        "time": settings.timeout_min,
        "nodes": 1,
        "ntasks_per_node": 1,
        "cpus_per_task": asked.cpus,
        "mem": f"{asked.mem_mb}M",
        "array_parallelism": settings.array_parallelism,
        # submitit's warning signal before the time limit; it must come well after the
        # start, or submitit believes the job timed out at once.
        "signal_delay_s": min(90, settings.timeout_min * 15),
    }
    if settings.partition:
        params["partition"] = settings.partition
    if asked.gpus:
        params["gpus_per_node"] = asked.gpus
    # {"account": "abc", "exclusive": true} -> #SBATCH --account=abc / --exclusive
    extra = {k.replace("-", "_"): v for k, v in settings.extra_sbatch.items()}
    params["additional_parameters"] = {"no_requeue": True, **extra}
    return params


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    mem_mb: int
    gpus: int


def _gpus(gres: str) -> int:
    """GPUs of a node's ``sinfo %G``: ``gpu:2``, ``gpu:a100:4(S:0-1)``, ``(null)``..."""
    return sum(int(m.group(1)) for m in re.finditer(r"gpu(?::[^:,()]+)?:(\d+)", gres))


def _nodes(partition: str | None) -> tuple[str, list[Node]]:
    """(the partition's name, its nodes) from ``sinfo``; the default partition when ``partition`` is None."""
    args = ["sinfo", "-h", "-N", "-o", "%N|%c|%m|%G|%P"] + (["-p", partition] if partition else [])
    proc = command(args)
    if proc is None or proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no answer"])[-1] if proc else "sinfo did not answer"
        raise BadInput(f"cannot ask Slurm what the partition offers ({why})", key="executor")
    nodes, names = [], set()
    for line in proc.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 5:
            continue
        name, cpus, mem, gres, part = fields
        if partition is None and not part.endswith("*"):  # the default partition is starred
            continue
        names.add(part.rstrip("*"))
        nodes.append(Node(name, int(cpus), int(mem.rstrip("+")), _gpus(gres)))
    return partition or (min(names) if names else "(default)"), nodes


def _limits(partition: str) -> tuple[int | None, int | None]:
    """(MaxCPUsPerNode, MaxMemPerNode in MiB) of the partition; None where unlimited or unknown."""
    proc = command(["scontrol", "show", "partition", "-o", partition])
    text = proc.stdout if proc is not None and proc.returncode == 0 else ""
    cpus = re.search(r"MaxCPUsPerNode=(\d+)", text)
    mem = re.search(r"MaxMemPerNode=(\d+)", text)
    return (int(cpus.group(1)) if cpus else None), (int(mem.group(1)) if mem else None)


def check(cases: Iterable[Case], settings) -> None:
    """BadInput, before anything is submitted, when a case's request fits no node of the partition."""
    asked = sorted({request(case, settings) for case in cases})
    if not asked:
        return
    partition, nodes = _nodes(settings.partition)
    max_cpus, max_mem = _limits(partition)
    offers = [Node(n.name, min(n.cpus, max_cpus or n.cpus), min(n.mem_mb, max_mem or n.mem_mb), n.gpus) for n in nodes]
    for want in asked:
        if any(n.cpus >= want.cpus and n.mem_mb >= want.mem_mb and n.gpus >= want.gpus for n in offers):
            continue
        if not offers:
            raise BadInput(
                f"slurm partition {partition} has no nodes; a case's job asks {want.describe()}", key="executor"
            )
        best = max(offers, key=lambda n: (n.cpus, n.mem_mb, n.gpus))
        most = Request(max(n.cpus for n in offers), max(n.mem_mb for n in offers), max(n.gpus for n in offers))
        raise BadInput(
            f"a case's Slurm job asks {want.describe()}, but partition {partition} offers at most "
            f"{most.describe(gpus_too=bool(want.gpus))} per node (e.g. {best.name}): nothing was submitted; "
            "lower threads, "
            "cpus_per_task, mem_gb or gpus_per_node in bench.toml, or choose another partition",
            key="executor",
        )
