"""Reading ``bench.toml`` (project defaults) and suite files into validated models.

Every problem becomes one ``BadInput`` naming the file, the key and what was
expected, raised before anything is written. Precedence of values: bench.toml,
then the suite, then the command line (applied by the runner).
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from topk_bench.errors import BadInput

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CONFIG_NAME = "bench.toml"
DTYPES = ("float32", "float64", "float16", "bfloat16")

# Shape parameters of each workload, with BERT-base defaults (paper §3) for those a suite leaves out.
SHAPE_DEFAULTS: dict[str, dict[str, int]] = {
    "mha": {"seq_len": 512, "batch": 1, "d_model": 768, "heads": 12},
    "ff": {"seq_len": 512, "batch": 1, "d_model": 768, "d_ff": 3072},
    "decoder": {"seq_len": 512, "batch": 1, "d_model": 768, "heads": 12, "d_ff": 3072, "layers": 12},
}
METRICS = ("memory", "time", "flops", "rel_err", "grad_cos", "emb_cos", "nn_agree", "nn_spearman")


class _Strict(BaseModel):
    # strict: no "512" -> 512 or true -> 1 coercion; a suite says exactly what it means.
    model_config = ConfigDict(extra="forbid", strict=True)


class ExecutorSettings(_Strict):
    """The ``[executor]`` table of bench.toml: where cases run."""

    kind: Literal["local", "slurm"] = "local"
    jobs: int = Field(1, ge=1)
    # Slurm (topk_bench.slurm through submitit)
    partition: str | None = None
    gpus_per_node: int = Field(1, ge=0)
    cpus_per_task: int = Field(4, ge=1)
    mem_gb: float = Field(64, gt=0)
    timeout_min: int = Field(60, ge=1)
    array_parallelism: int = Field(16, ge=1)
    extra_sbatch: dict[str, Any] = Field(default_factory=dict)
    log_dir: str = "results/slurm-logs"


class Settings(_Strict):
    """bench.toml: defaults of every run."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal[DTYPES] = "float32"  # type: ignore[valid-type]
    warmup: int = Field(1, ge=0)
    repeats: int = Field(3, ge=1)
    max_memory_gib: float = Field(30.0, gt=0)
    # Chosen so that suites/mha.toml measured on a 2-core CPU ends in about 15 minutes.
    max_case_seconds: float = Field(60.0, gt=0)
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


class PlotSection(_Strict):
    """``[plot]``: how ``topk-bench plot`` draws the suite (written to ``<suite>.meta.json``)."""

    x: str | None = None          # column on the x axis; default: the (first) swept parameter
    x_label: str | None = None    # default: chosen by the plotter from the column name
    log_x: int = Field(0, ge=0)   # 0: linear; otherwise the log base
    log_y: bool = False
    panels: list[list[float]] = Field(default_factory=list)  # [xmin, xmax] ranges, side by side
    metrics: list[Literal[METRICS]] = Field(default_factory=lambda: ["memory", "time"], min_length=1)  # type: ignore[valid-type]
    renderer: str | None = None   # "module:function" of a plug-in renderer

    @field_validator("log_x")
    @classmethod
    def _base(cls, value: int) -> int:
        if value == 1:
            raise ValueError(f"0 (linear) or a log base of at least 2, got {value}")
        return value

    @field_validator("panels")
    @classmethod
    def _ranges(cls, value: list[list[float]]) -> list[list[float]]:
        for pair in value:
            if len(pair) != 2 or not pair[0] < pair[1]:
                raise ValueError(f"[xmin, xmax] ranges with xmin < xmax, got {pair}")
        return value


class ImplEntry(BaseModel):
    """One ``[[impl]]``: a registry name, an optional legend and the implementation's options inline."""

    model_config = ConfigDict(extra="allow", strict=True)

    name: str
    label: str | None = None
    # Per-entry workload and its masking/activation (default: the suite's), so that one
    # suite (smoke.toml) can cover every workload; [shape]/[sweep] keys a workload lacks do not apply to it.
    workload: Literal["mha", "ff", "decoder", "pretrained"] | None = None
    causal: bool | None = None
    activation: Literal["softmax", "relu"] | None = None
    feedforward: str | None = None  # decoder only: the feed-forward implementation
    feedforward_options: dict[str, Any] = Field(default_factory=dict)

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class Suite(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # it names the CSV file
    title: str = ""
    workload: Literal["mha", "ff", "decoder", "pretrained"]
    mode: Literal["fwd", "fwd_bwd"] = "fwd_bwd"
    causal: bool | None = None          # default: True for the decoder, else False
    activation: Literal["softmax", "relu"] | None = None  # default: relu for ff, else softmax
    dtype: Literal[DTYPES] | None = None  # type: ignore[valid-type]
    seed: int = Field(0, ge=0)
    repeats: int | None = Field(None, ge=1)
    warmup: int | None = Field(None, ge=0)
    max_memory_gib: float | None = Field(None, gt=0)
    max_case_seconds: float | None = Field(None, gt=0)
    plugins: list[str] = Field(default_factory=list)
    fidelity: bool = False
    shape: dict[str, int | float | str] = Field(default_factory=dict)
    sweep: dict[str, list[int]] = Field(min_length=1)
    impl: list[ImplEntry] = Field(min_length=1)
    plot: PlotSection = Field(default_factory=PlotSection)
    _path: Path | None = PrivateAttr(None)  # the file it was read from

    @property
    def path(self) -> Path | None:
        return self._path

    @model_validator(mode="after")
    def _defaults(self) -> "Suite":
        if not self.title:
            self.title = self.name
        if self.causal is None:
            self.causal = self.workload == "decoder"
        if self.activation is None:
            self.activation = "relu" if self.workload == "ff" else "softmax"
        return self

    def entry_settings(self, entry: ImplEntry) -> tuple[str, bool, str]:
        """(workload, causal, activation) of an ``[[impl]]``: its own, else the suite's, else the workload's defaults."""
        workload = entry.workload or self.workload
        same = workload == self.workload
        causal = entry.causal if entry.causal is not None else (self.causal if same else workload == "decoder")
        activation = entry.activation or (self.activation if same else ("relu" if workload == "ff" else "softmax"))
        return workload, bool(causal), str(activation)


# ---------------------------------------------------------------- reading files


def _read_toml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise BadInput("file not found", file=path)
    if path.is_dir():
        raise BadInput("expected a TOML file, got a directory", file=path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"unreadable ({exc.__class__.__name__}: {exc})", file=path) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"invalid TOML ({exc})", file=path) from None


def _key(loc: tuple, data: dict[str, Any]) -> str:
    """``('impl', 2, 'topk')`` -> ``impl[2] (topk).topk``: the key as a user finds it in the file."""
    parts: list[str] = []
    node: Any = data
    for item in loc:
        if isinstance(item, int):
            name = ""
            if isinstance(node, list) and item < len(node) and isinstance(node[item], dict):
                name = f" ({node[item].get('name')})" if "name" in node[item] else ""
            parts[-1:] = [f"{parts[-1] if parts else ''}[{item}]{name}"]
        elif item in ("function-after", "function-before", "tagged-union", "literal"):  # pydantic internals
            continue
        else:
            parts.append(str(item))
        try:
            node = node[item]
        except (KeyError, IndexError, TypeError):
            node = None
    return ".".join(parts)


def _problem(error: dict[str, Any], fields: list[str] | None = None) -> str:
    kind, msg, value = error["type"], error["msg"], error.get("input")
    if kind == "extra_forbidden":
        known = f" (expected one of: {', '.join(fields)})" if fields else ""
        return f"unknown key{known}"
    if kind == "missing":
        return "missing required key"
    if kind == "too_short":
        return f"expected at least {error.get('ctx', {}).get('min_length', 1)} entry, got none"
    if kind == "value_error":  # our validators say what they expected and what they got
        return "expected " + re.sub(r"^Value error, ", "", msg)
    msg = re.sub(r"^(Input|Value) should (be |have )?", "", msg)
    return f"expected {msg}, got {value!r}"


def _raise(exc: ValidationError, model: type[BaseModel], data: dict[str, Any], path: Path) -> None:
    error = exc.errors()[0]
    loc = tuple(error["loc"])
    # The keys the enclosing table accepts, for "unknown key" errors.
    fields = None
    if error["type"] == "extra_forbidden":
        owner: Any = model
        for item in loc[:-1]:
            info = getattr(owner, "model_fields", {}).get(item) if isinstance(item, str) else None
            owner = info.annotation if info is not None else owner
        if hasattr(owner, "model_fields"):
            fields = list(owner.model_fields)
    raise BadInput(_problem(error, fields), file=path, key=_key(loc, data) or None) from None


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
    data = _read_toml(path)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        _raise(exc, Settings, data, path)
    settings._root = path.resolve().parent
    return settings


def load_suite(path: str | Path) -> Suite:
    """A validated suite: schema, then its meaning against the workload and the registry."""
    path = Path(path)
    data = _read_toml(path)
    try:
        suite = Suite.model_validate(data)
    except ValidationError as exc:
        _raise(exc, Suite, data, path)
    suite._path = path
    from topk_bench.suite_checks import check_suite  # needs the registry (imports torch)

    check_suite(suite, path)
    return suite


def import_plugins(modules: list[str], path: Path | None = None, key: str = "plugins") -> list[str]:
    """Import plug-ins so their implementations register here (the worker imports them again in the child).

    A plug-in is a module name (importable from the current directory or installed) or a
    ``.py`` file, relative to the suite's directory; returned with files made absolute.
    """
    from topk_bench.worker import import_plugins as _import  # the child's own loader: same rules

    cwd = str(Path.cwd())
    if cwd not in sys.path:  # as `python -m` would find a module of the current directory
        sys.path.append(cwd)
    resolved = []
    for module in modules:
        if module.endswith(".py") or "/" in module:
            file = Path(module)
            if not file.is_absolute() and path is not None:
                file = Path(path).resolve().parent / file
            if not file.is_file():
                raise BadInput(f"plug-in file not found: {file}", file=path, key=key)
            module = str(file.resolve())
        try:
            _import([module])
        except Exception as exc:  # any failure of user code is bad input, reported in one line
            raise BadInput(f"cannot import plug-in {module!r} ({type(exc).__name__}: {exc})",
                           file=path, key=key) from None
        resolved.append(module)
    return resolved
