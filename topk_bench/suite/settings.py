"""``bench.toml``: the project's defaults of every run (device, dtype, repeats, budgets, folders, executor).

Precedence of values: bench.toml, then the suite, then the command line
(applied by :mod:`topk_bench.run.plan`). Relative paths in the file are
relative to the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr

from topk_bench.suite.files import Strict, read_toml, validate
from topk_bench.suite.values import (
    AtLeastOne,
    AtLeastZero,
    GiB,
    Jobs,
    SampleSeconds,
    Seconds,
    Threads,
    WarmupSeconds,
)
from topk_bench.types import DType

CONFIG_NAME = "bench.toml"


class ExecutorSettings(Strict):
    """The ``[executor]`` table of bench.toml: where cases run."""

    kind: Literal["local", "slurm"] = "local"
    jobs: Jobs = 1
    # Slurm (topk_bench.run.slurm.executor through submitit)
    partition: str | None = None
    gpus_per_node: int = Field(1, ge=0)  # asked for only by jobs of cases measured on CUDA
    cpus_per_task: int = Field(4, ge=1)
    mem_gb: float = Field(64, gt=0)
    timeout_min: int = Field(60, ge=1)
    array_parallelism: int = Field(16, ge=1)
    extra_sbatch: dict[str, Any] = Field(default_factory=dict)
    log_dir: str = "results/slurm-logs"


class Settings(Strict):
    """bench.toml: defaults of every run."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal[DType.values()] = "float32"  # type: ignore[valid-type]  # a Literal built at run time
    # The warm-up (our protocol): at least `warmup` untimed iterations (the profiling one included) and at
    # least `warmup_s` seconds of them, as triton.testing.do_bench's 25 ms.
    warmup: AtLeastZero = 2
    warmup_s: WarmupSeconds = 0.025
    repeats: AtLeastOne = 3
    # Each timed sample at least this long, the iteration run back to back (0: one iteration a sample).
    min_sample_s: SampleSeconds = 0.0
    # Intra-op CPU threads of each measured case; "auto": the cores not already busy at the run's start,
    # so that a CPU run does not oversubscribe a shared machine (run/resolve.py).
    threads: Threads = "auto"
    max_memory_gib: GiB = 30.0
    # Chosen so that suites/mha.toml measured on a 2-core CPU ends in about 15 minutes.
    max_case_seconds: Seconds = 60.0
    # A run with more cases to run than this is refused unless --yes: 1000 cases take
    # from about an hour (start-up alone) to 17 hours (every case using the 60 s budget).
    max_cases: int = Field(1000, ge=1)
    results_dir: str = "results"
    plots_dir: str = "plots"
    executor: ExecutorSettings = Field(default_factory=ExecutorSettings)
    # Directory relative paths are resolved against (bench.toml's own directory); not a key of the file.
    _root: Path = PrivateAttr(default_factory=Path.cwd)

    @property
    def root(self) -> Path:
        return self._root

    def path(self, value: str | Path) -> Path:
        value = Path(value)
        return value if value.is_absolute() else self._root / value


def find_config(start: Path | None = None) -> Path | None:
    """``bench.toml`` in the current directory (the one the runner uses), or None."""
    candidate = (start or Path.cwd()) / CONFIG_NAME
    return candidate if candidate.is_file() else None


def load_settings(path: str | Path | None = None) -> Settings:
    """bench.toml at ``path``, else in the current directory, else the built-in defaults."""
    if path is None:
        found = find_config()
        if found is None:
            return Settings()
        path = found
    path = Path(path)
    settings = validate(Settings, read_toml(path), path)
    settings._root = path.resolve().parent
    return settings
