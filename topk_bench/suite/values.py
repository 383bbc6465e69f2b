"""The values a run's settings take, defined once for bench.toml, the suite and the command line.

Each is a pydantic type: the schemas (:mod:`.schema`, :mod:`.settings`) declare their
keys with it, and the flags (:class:`topk_bench.run.resolve.Flags`) are validated
through the same type (:func:`check_flag`), so that ``--max-case-seconds inf`` and
``max_case_seconds = inf`` are refused alike, in one line naming the flag or the key.

Bounds are finite numbers a run can act on: a time budget the launcher can wait for
(``threading`` waits at most ``threading.TIMEOUT_MAX``; a week is far past any case), a
memory budget whose bytes stay a finite number in the CSV, and no more job slots than
threads this process may start.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, PlainValidator, TypeAdapter, ValidationError

from topk_bench.errors import BadInput
from topk_bench.suite.files import problem

# A case may take a week; beyond that a budget is a typo, and past threading.TIMEOUT_MAX (~292 years here,
# 49 days on some platforms) waiting for it raises OverflowError.
MAX_CASE_SECONDS = 7 * 24 * 3600.0
# A pebibyte: more than any machine, and its bytes (2**50) still a finite float in the CSV.
MAX_MEMORY_GIB = float(1 << 20)
# Job slots: each is a thread of this process and, at a time, a child process.
MAX_JOBS = 1024

Seconds = Annotated[float, Field(gt=0, le=MAX_CASE_SECONDS, allow_inf_nan=False)]
GiB = Annotated[float, Field(gt=0, le=MAX_MEMORY_GIB, allow_inf_nan=False)]
Jobs = Annotated[int, Field(ge=1, le=MAX_JOBS)]
AtLeastOne = Annotated[int, Field(ge=1)]  # repeats, rounds
AtLeastZero = Annotated[int, Field(ge=0)]  # warmup
WarmupSeconds = Annotated[float, Field(ge=0, le=MAX_CASE_SECONDS, allow_inf_nan=False)]  # warmup_s: 0 is none
# min_sample_s: 0 is one iteration a sample; at most a minute, since a case runs repeats of them in its budget.
SampleSeconds = Annotated[float, Field(ge=0, le=60, allow_inf_nan=False)]


def _threads(value: Any) -> int | str:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_THREADS):
        return value
    raise ValueError(f'a number from 1 to {MAX_THREADS} or "auto", got {value!r}')


# A case's intra-op CPU threads: a number, or "auto" (the cores not already busy when the run starts).
MAX_THREADS = 1024
Threads = Annotated[int | str, PlainValidator(_threads)]

_ADAPTERS: dict[Any, TypeAdapter] = {}


def check_flag(flag: str, value: Any, kind: Any) -> None:
    """``value`` given as ``flag`` (None: not given) is a valid ``kind``, or BadInput naming the flag."""
    if value is None:
        return
    adapter = _ADAPTERS.setdefault(kind, TypeAdapter(kind))
    try:
        adapter.validate_python(value, strict=True)
    except ValidationError as exc:
        raise BadInput(problem(exc.errors()[0]), key=flag) from None
