"""The words every side of the harness shares, and the messages that cross its process boundaries.

Floor 1: this module imports nothing of the harness (and not torch), so that the
command line, the parent, the warm template and the child all import it.

- :class:`Mode`, :class:`Method`, :class:`DeviceKind`, :class:`Timer`, :class:`DType`: ``str``
  enums. Each member *is* its CSV/JSON/TOML spelling (``Mode.FWD == "fwd"``), so
  rows and case ids read and hash as the plain strings do; code compares members, never bare
  strings (``case.method is Method.MEASURED``).
- The parent <-> template messages (one ``AF_UNIX``/``SOCK_SEQPACKET`` datagram
  each, JSON with a ``"type"``): :class:`Start` and :class:`Kill` (parent to
  template), :class:`Started`, :class:`Exited` and :class:`Refused` (template to
  parent), each encoded and decoded by :func:`encode` / :func:`decode` only.
- :data:`READY`: the one byte a child writes on its ready pipe once started (the
  case's time budget counts from then); :data:`RESULT_UNWRITTEN`: its exit code when
  it could not write its result.

The case itself, its budget and its measurement travel as JSON files written and
read by their own classes (:mod:`topk_bench.case`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any, ClassVar, TypeVar

W = TypeVar("W", bound="Word")


class Word(str, Enum):
    """A ``str`` enum whose members print, format and serialise as their value."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(m.value for m in cls)

    @classmethod
    def parse(cls: type[W], value: str, what: str | None = None) -> W:
        """The member spelled ``value``; ValueError naming the known spellings otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"unknown {what or cls.__name__.lower()} {value!r} (known: {', '.join(cls.values())})"
            ) from None


class Mode(Word):
    """What one iteration runs: the forward pass, or forward and backward (``loss = out.mean()``)."""

    FWD = "fwd"
    FWD_BWD = "fwd_bwd"

    @property
    def backward(self) -> bool:
        return self is Mode.FWD_BWD


class Method(Word):
    """How a case's numbers are obtained: run and measured, or predicted (fake tensors, nothing computed)."""

    MEASURED = "measured"
    PREDICTED = "predicted"


class DeviceKind(Word):
    """The kind of a device string (``cuda:1`` is ``CUDA``)."""

    CPU = "cpu"
    CUDA = "cuda"

    @classmethod
    def of(cls, device: str) -> DeviceKind:
        """The kind of ``device``; ValueError for a device the harness does not run on."""
        return cls.parse(str(device).split(":")[0], "device")

    @classmethod
    def read(cls, device: object) -> DeviceKind | None:
        """The kind a results file's ``device`` cell names, None for anything else (a reader never raises)."""
        try:
            return cls(str(device).split(":")[0])
        except ValueError:
            return None


class GpuModel(Word):
    """The GPU a CUDA prediction models (``run --predict --device cuda --gpu``): a part with its memory, as NVIDIA
    sells it (topk_bench.predict.kernels.gpus holds each part's specification). ``sm80`` and ``sm90``, the
    compute capabilities earlier versions named, still parse: as the A100 80 GB and the H100 SXM."""

    H100_SXM = "h100-sxm"
    H100_PCIE = "h100-pcie"
    H200 = "h200"
    A100_40GB = "a100-40gb"
    A100_80GB = "a100-80gb"
    L4 = "l4"
    B200 = "b200"

    @classmethod
    def _missing_(cls, value: object) -> GpuModel | None:
        text = str(value).strip().lower()
        return GPU_ALIASES.get(text) or next((m for m in cls if m.value == text), None)


# The compute capabilities earlier versions named, as the parts they now parse as.
GPU_ALIASES = {"sm80": GpuModel.A100_80GB, "sm90": GpuModel.H100_SXM}
DEFAULT_GPU = GpuModel.H100_SXM  # what a CUDA prediction models unless told: the GPU of the committed H100 data


class Timer(Word):
    """How a measured iteration is timed. On the CPU: wall time (``perf_counter``, the default), or the CPU
    seconds of the process (``process_time``: what the iteration cost, whatever else the machine runs; with one
    thread, its time free of descheduling). On CUDA: events around each eager iteration (``events``, the
    default) or around each replay of one iteration captured in a CUDA graph (``cudagraph``: no host dispatch in
    the time). A suite and ``--timer`` choose; a timer of the other device is noted and left out."""

    PERF_COUNTER = "perf_counter"
    PROCESS_TIME = "process_time"
    EVENTS = "events"
    CUDAGRAPH = "cudagraph"

    @classmethod
    def cuda_choices(cls) -> tuple[str, ...]:
        return (cls.EVENTS.value, cls.CUDAGRAPH.value)

    @classmethod
    def cpu_choices(cls) -> tuple[str, ...]:
        return (cls.PERF_COUNTER.value, cls.PROCESS_TIME.value)

    @classmethod
    def choices(cls) -> tuple[str, ...]:
        """What a suite's ``timer`` and ``--timer`` take: the CUDA timers, then the CPU's."""
        return (*cls.cuda_choices(), *cls.cpu_choices())

    @property
    def device_kind(self) -> DeviceKind:
        return DeviceKind.CPU if self.value in self.cpu_choices() else DeviceKind.CUDA


class DType(Word):
    """The dtypes a case may run in (bench.toml's and a suite's ``dtype``)."""

    FLOAT32 = "float32"
    FLOAT64 = "float64"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"

    @property
    def itemsize(self) -> int:
        """Bytes of one element."""
        return {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}[self.value]

    @property
    def half(self) -> bool:
        return self in (DType.FLOAT16, DType.BFLOAT16)

    def to_torch(self):
        """The ``torch.dtype`` (torch imported here, lazily: this module must not import it)."""
        import torch

        return getattr(torch, self.value)


# -- parent <-> template --------------------------------------------------------------------------

READY = b"r"  # child -> parent, on the ready pipe: started; the time budget counts from here
# The child's exit code when it measured but could not write its result (sysexits' EX_TEMPFAIL): the parent
# then asks whether its scratch directory can be written at all (a full TMPDIR is no case's failure).
RESULT_UNWRITTEN = 75


@dataclass(frozen=True)
class Message:
    """One datagram between the parent and its warm template; ``id`` names the request (one child)."""

    TYPE: ClassVar[str] = ""
    id: int


@dataclass(frozen=True)
class Start(Message):
    """Parent -> template, with two file descriptors (the child's ready pipe, its log): fork a worker
    running ``python -m topk_bench.child.worker ARGV``. ``env``: the variables a child sets for itself
    (threads, GPU); ``threads``: what torch would take from them at start-up (None: its default)."""

    TYPE: ClassVar[str] = "start"
    argv: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    threads: int | None = None


@dataclass(frozen=True)
class Kill(Message):
    """Parent -> template: SIGKILL the child's process group."""

    TYPE: ClassVar[str] = "kill"


@dataclass(frozen=True)
class Started(Message):
    """Template -> parent: the child runs as ``pid``; ``fresh`` says why it is a fresh interpreter, not a fork."""

    TYPE: ClassVar[str] = "started"
    pid: int = 0
    fresh: str = ""


@dataclass(frozen=True)
class Exited(Message):
    """Template -> parent: the child was reaped; ``code`` as :mod:`subprocess` has it (``-SIGNAL``);
    ``leftovers``: processes it left running that the template then killed (``sleep 300 (pid 12)``)."""

    TYPE: ClassVar[str] = "exited"
    code: int = 0
    leftovers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refused(Message):
    """Template -> parent: no child was started, and why."""

    TYPE: ClassVar[str] = "refused"
    error: str = ""


MESSAGES: dict[str, type[Message]] = {m.TYPE: m for m in (Start, Kill, Started, Exited, Refused)}


def encode(message: Message) -> bytes:
    return json.dumps({"type": message.TYPE, **asdict(message)}).encode()


def decode(data: bytes) -> Message:
    """The message of one datagram; ValueError for anything else."""
    try:
        raw: Any = json.loads(data)
        kind = MESSAGES[raw.pop("type")]
        known = {f.name for f in fields(kind)}
        values = {k: v for k, v in raw.items() if k in known}
        for name in ("argv", "leftovers"):
            if name in values:
                values[name] = tuple(values[name])
        return kind(**values)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"not a template message: {data[:200]!r} ({exc})") from None
