"""``topk-bench run``: measure (or predict) a suite, appending to ``OUT/<suite>.csv``; resumable."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from topk_bench.cli import Command, app
from topk_bench.types import DEFAULT_GPU, GPU_ALIASES, GpuModel


def terminate_as_interrupt(signum, frame):
    """SIGTERM (e.g. from a scheduler) and SIGHUP (the terminal went away) end the run like Ctrl-C: the
    executor cancels what it started (Slurm jobs included) and every finished case is in the CSV."""
    raise KeyboardInterrupt


ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def start_template_early(config: Path | None, executor: str | None) -> None:
    """Start the warm template (it imports torch) before this process imports torch to plan: they overlap.

    Local executor only: a Slurm job starts its own on its node. A run that then
    stops on bad input ends the template with it, unused.
    """
    from topk_bench.errors import BadInput  # none of these imports torch
    from topk_bench.run import launcher
    from topk_bench.suite.settings import load_settings

    try:
        kind = executor or load_settings(config).executor.kind  # the flag over bench.toml, as the plan has it
    except BadInput:
        return  # the run reports it
    if kind == "local":
        launcher.prestart()


def gpu_help() -> str:
    """``--gpu``'s help: every part of the GPU catalogue (:class:`~topk_bench.types.GpuModel`, the keys of
    ``topk_bench.predict.kernels.gpus.GPUS``), the default marked, and the spellings earlier versions took. Read
    from ``topk_bench.types``: the catalogue's module imports torch, which ``--help`` does not."""
    parts = ", ".join(f"{m.value} (the default)" if m is DEFAULT_GPU else m.value for m in GpuModel)
    aliases = ", ".join(f"{alias}: {m.value}" for alias, m in GPU_ALIASES.items())
    return (
        "With --predict --device cuda: the GPU modelled, its memory the budget, its peaks the predicted time: "
        f"{parts} ({aliases})."
    )


# The options of `run`, each declared once here (typer reads them from the annotations).
OutOption = Annotated[
    Path | None, typer.Option("--out", metavar="DIR", help="Results directory (default: results_dir of bench.toml).")
]
DeviceOption = Annotated[
    str | None,
    typer.Option("--device", metavar="auto|cpu|cuda", help="auto | cpu | cuda (default: bench.toml's, auto)."),
]
PredictOption = Annotated[
    bool,
    typer.Option(
        "--predict",
        help="Predict peak memory under FakeTensorMode, no GPU needed: any size, no time (--device cuda: CUDA's "
        "kernels' own allocations through a model of the CUDA caching allocator, with reserved bytes).",
    ),
]
GpuOption = Annotated[str | None, typer.Option("--gpu", metavar="PART", help=gpu_help())]
RepeatsOption = Annotated[int | None, typer.Option("--repeats", metavar="N", help="Timed iterations per case.")]
WarmupOption = Annotated[
    int | None,
    typer.Option(
        "--warmup", metavar="N", help="Untimed iterations before them, at least (the profiling one included)."
    ),
]
WarmupSecondsOption = Annotated[
    float | None,
    typer.Option(
        "--warmup-s", metavar="S", help="... and at least this many seconds of them (default: bench.toml's, 0.025)."
    ),
]
MinSampleSecondsOption = Annotated[
    float | None,
    typer.Option(
        "--min-sample-s",
        metavar="S",
        help="Each timed sample runs the iteration back to back until it lasts S seconds, its time their mean "
        "(default: the suite's, else bench.toml's, 0: one iteration a sample).",
    ),
]
TimerOption = Annotated[
    str | None,
    typer.Option(
        "--timer",
        metavar="TIMER",
        help="How an iteration is timed. CUDA: events (around it, the default) or cudagraph (around a replay of it "
        "captured in a CUDA graph: no host dispatch in the time). CPU: perf_counter (wall, the default) or "
        "process_time (the process's CPU seconds: free of descheduling on a busy machine).",
    ),
]
FlushL2Option = Annotated[
    bool | None,
    typer.Option(
        "--flush-l2/--no-flush-l2",
        help="Flush the device's cache (zero a buffer twice its size) before each timed iteration, outside the "
        "timing (default: the suite's, off).",
    ),
]
RoundsOption = Annotated[
    int | None,
    typer.Option(
        "--rounds",
        metavar="N",
        help="Measure each case in N child processes, round-robin over the cases; its row pools the N rounds' times "
        "(default: the suite's rounds, 1). Ratios between cases then hold while the machine's load drifts.",
    ),
]
MaxMemoryOption = Annotated[
    float | None,
    typer.Option("--max-memory", metavar="GIB", help="Memory budget per case in GiB (over it: over_budget)."),
]
MaxCaseSecondsOption = Annotated[
    float | None, typer.Option("--max-case-seconds", metavar="S", help="Time budget per case (over it: timeout).")
]
RemeasureOption = Annotated[
    str | None,
    typer.Option(
        "--remeasure",
        metavar="FLAGS",
        help="Measure again exactly the rows whose trust column carries one of these flags (contended,busy,noisy: "
        "comma-separated); their old rows are kept in OUT/history/<suite>.csv, every other row stays.",
    ),
]
ResumeOption = Annotated[
    bool,
    typer.Option(
        "--resume/--no-resume",
        help="Skip cases already in the CSV (default), or measure them all again (each old row goes once its case "
        "has a new one).",
    ),
]
ExecutorOption = Annotated[
    str | None,
    typer.Option(
        "--executor",
        metavar="local|slurm",
        help="local | slurm (default: kind in bench.toml's executor table). slurm: one job per case via "
        "submitit; its log folder (log_dir, default results/slurm-logs) must be on a filesystem "
        "shared with the compute nodes.",
    ),
]
JobsOption = Annotated[
    str | None,
    typer.Option(
        "--jobs",
        metavar="N|auto",
        help="Cases at once on the local executor: N, or auto for one per core (default: bench.toml's, 1; auto with "
        "--predict).",
    ),
]
ThreadsOption = Annotated[
    str | None,
    typer.Option(
        "--threads",
        metavar="N|auto",
        help="Intra-op CPU threads of each measured case: N, or auto for the cores other processes are not keeping "
        "busy at the start (default: the suite's, else bench.toml's, auto); the rows record it (column threads).",
    ),
]
SetsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUES",
        help="Replace the suite's values of a key for this run (repeatable): a parameter (seq_len=16384, "
        "seq_len=1024,2048: swept), or an implementation option (topk=64). Said in OUT/<suite>.meta.json.",
    ),
]
ConfigOption = Annotated[
    Path | None, typer.Option("--config", metavar="FILE", help="bench.toml to use (default: ./bench.toml if present).")
]
ProfileOption = Annotated[
    bool,
    typer.Option(
        "--profile",
        help="Also profile each case (as `topk-bench profile`): OUT/profile/<case_id>/ gets peak.csv, timeline.png, "
        "profile.json, and where measured ops.csv and trace.json. The rows are the same.",
    ),
]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="No progress, only the summary.")]
YesOption = Annotated[
    bool,
    typer.Option(
        "--yes",
        "-y",
        help="Run even more cases than max_cases (bench.toml or the suite; default 1000), or more rounds than 1000.",
    ),
]
AppendOption = Annotated[
    bool,
    typer.Option(
        "--append",
        help="Add this suite's rows to OUT/<suite>.csv even when it holds the rows of another suite of the same "
        "name (another suite_fingerprint: its cases differ); without it, that is an error. meta.json then "
        "describes this suite.",
    ),
]


@app.command("run", cls=Command)
def run(
    suite: Annotated[Path, typer.Argument(metavar="SUITE", help="Suite file, e.g. suites/mha.toml.")],
    out: OutOption = None,
    device: DeviceOption = None,
    predict: PredictOption = False,
    gpu: GpuOption = None,
    repeats: RepeatsOption = None,
    warmup: WarmupOption = None,
    warmup_s: WarmupSecondsOption = None,
    min_sample_s: MinSampleSecondsOption = None,
    timer: TimerOption = None,
    flush_l2: FlushL2Option = None,
    rounds: RoundsOption = None,
    max_memory: MaxMemoryOption = None,
    max_case_seconds: MaxCaseSecondsOption = None,
    remeasure: RemeasureOption = None,
    resume: ResumeOption = True,
    executor: ExecutorOption = None,
    jobs: JobsOption = None,
    threads: ThreadsOption = None,
    sets: SetsOption = None,
    config: ConfigOption = None,
    profile: ProfileOption = False,
    quiet: QuietOption = False,
    yes: YesOption = False,
    append: AppendOption = False,
) -> None:
    """Run SUITE: one row per case in OUT/<suite>.csv, appended as each case ends, plus OUT/<suite>.meta.json."""
    start_template_early(config, executor)
    from topk_bench.run import runner  # imported here: `topk-bench --help` stays fast
    from topk_bench.run.resolve import Flags

    flags = Flags(
        out=out,
        device=device,
        predict=predict,
        repeats=repeats,
        warmup=warmup,
        warmup_s=warmup_s,
        min_sample_s=min_sample_s,
        timer=timer,
        flush_l2=flush_l2,
        max_memory_gib=max_memory,
        max_case_seconds=max_case_seconds,
        executor=executor,
        jobs=jobs,
        rounds=rounds,
        threads=threads,
        remeasure=remeasure,
        gpu=gpu,
        profile=profile,
        sets=tuple(sets or ()),
    )
    previous = {sig: signal.signal(sig, terminate_as_interrupt) for sig in ENDING_SIGNALS}
    try:
        result = runner.run(suite, flags, config=config, resume=resume, progress=not quiet, yes=yes, append=append)
    except KeyboardInterrupt:
        print("topk-bench: interrupted; every finished case is in the CSV, run again to resume", file=sys.stderr)
        raise typer.Exit(130) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    runner.print_summary(result)
