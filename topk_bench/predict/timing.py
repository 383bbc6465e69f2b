"""Predicted time on a GPU the machine does not have: a cost per kernel of the fake run, run through one stream.

The fake run of a CUDA prediction dispatches the ops CUDA would, with their shapes and dtypes.
:class:`KernelCosts` records, for every op that launches a kernel (not a view, not an allocation:
:func:`topk_bench.aten_ops.launches_kernel`), its class, FLOPs, bytes and parallelism:

- FLOPs: ``torch.utils.flop_counter``'s formulas (matmuls, SDPA's kernels); a fused attention kernel with
  ``is_causal`` skips the masked tiles, so its FLOPs are scaled by the share of the score matrix a causal mask
  keeps (top-left aligned, as SDPA's ``is_causal``); a custom op (a Triton kernel) declares its own
  (:func:`register_cost`, :mod:`topk_bench.predict.cost_rules`: ``flop_counter`` knows no custom op);
- bytes: what the kernel reads and writes, its tensor inputs and outputs at their sizes (an expanded input
  counted at its storage's size, an input that is also the output once each way); a gather reads of its source
  only the rows it selects (``index_select``, ``embedding_bag``: not the whole table);
- parallelism: the thread blocks of a tiled kernel (a GEMM's output tiles, an attention kernel's row tiles:
  :func:`blocks`), or the threads of a kernel that walks a chain per output element (``embedding_bag``: one
  thread per output element loops over its bag, :func:`lanes`);
- the class (:class:`~topk_bench.aten_ops.KernelClass`, from the catalogue of aten ops): GEMM, SDPA
  forward, SDPA backward, elementwise and reductions, top-k and sort, gathers and scatters.

A kernel takes ``floor + max(compute, memory) + round trips`` on the device (:func:`device_seconds`):

- compute: ``FLOPs / (peak x efficiency[class] x busy)``, the part's peak for the kernel's dtype
  (:class:`~topk_bench.predict.kernels.gpus.Gpu`: float32 GEMMs on the CUDA cores, as the harness keeps TF32
  off; half on the tensor cores), ``busy`` the share of the SMs its blocks fill (at most one);
- memory: ``bytes / bandwidth``, the bandwidth achieved being the least of the part's times the class's
  efficiency, the blocks' (``blocks x`` what one block of a GEMM, or of an attention kernel, streams: a
  kernel of few blocks cannot fill the memory system, and the bandwidth one block sustains is not the part's
  over its SMs) and the lanes' (``lanes x`` what one thread walking a chain of dependent loads reads);
- round trips: a kernel whose programs wait for their loads one after another (a loop over a row whose every
  step needs the last one's result: a Triton kernel declares how many its longest program makes) pays each one
  the time a dependent load of a chain takes (:data:`CHAIN_LOAD_BYTES` at ``lane_bytes_per_s``), on top.

The device runs the kernels one after another on one stream. A CUDA graph's replay takes their sum; an eager
iteration is that stream fed by the host, which spends ``launch`` on each kernel it issues: a kernel starts
when the host has issued it and the previous one has ended (:func:`stream_seconds`), so a host-bound stretch
(many small kernels) and a device-bound one (a long GEMM) add up rather than hide each other, as they do on a
real GPU, where ``max(host, device)`` would be right only if the two were spread evenly.

The constants (:class:`Constants`) are global, a handful per class: fitted once by ``scripts/fit_gpu_time.py``
on part of the committed H100 rows and judged on the rest, written to ``gpu_time.json`` beside this module
(docs/predicting.md quotes how far off it is, and where).
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from topk_bench.aten_ops import AtenOp, Gather, KernelClass, is_iteration_op, launches_kernel
from topk_bench.aten_ops import of as catalogued
from topk_bench.measure.ops import OpCounter
from topk_bench.predict import custom_op_costs  # noqa: F401  (declares the costs of topk_bench/attention/'s custom ops)
from topk_bench.predict.cost_rules import Cost, causal_share, declared_cost, nbytes
from topk_bench.predict.cost_rules import register_cost as register_cost  # the documented path for plug-ins
from topk_bench.predict.kernels.gpus import Gpu
from topk_bench.types import Word

FITTED = Path(__file__).with_name("gpu_time.json")
CLASSES = tuple(KernelClass)  # the order of KernelTable.kind
ATTENTION_CLASSES = (KernelClass.ATTENTION_FWD, KernelClass.ATTENTION_BWD)


@dataclass(frozen=True)
class Kernel:
    op: str
    kind: KernelClass
    flops: float
    bytes: float
    dtype: str  # the dtype whose peak bounds it: "float32", "half", "float64"
    blocks: int = 0  # thread blocks it runs in parallel, where the kernel's tiling says (0: enough for every SM)
    lanes: int = 0  # threads that each walk a chain of dependent loads (0: not such a kernel)
    host_ops: int = 1  # ops the host dispatched since the previous kernel, this one's included (views too)
    round_trips: int = 0  # dependent memory round trips of its longest program, one after another (declared)


# The output tile one thread block of a GEMM computes (CUTLASS's and cuBLAS's usual 128 x 128), and the query
# (forward) or key (backward) rows one block of a fused attention kernel takes: a kernel of fewer blocks than
# the part has SMs leaves the others idle (a decode step's product over 131,072 keys into 8 x 4 x 128 outputs
# runs on 8 of 132 SMs).
GEMM_TILE = 128
ATTENTION_TILE = 64


def _tiles(n: int, tile: int) -> int:
    return max(1, -(-int(n) // tile))


def blocks(op: AtenOp, args, outputs: list[torch.Tensor]) -> int:
    """Thread blocks of a GEMM (output tiles x batch) or a fused attention kernel (batch x heads x row tiles)."""
    if op.output_tiles and outputs and outputs[0].dim() >= 2:
        product = outputs[0]
        batch = math.prod(product.shape[:-2])
        return batch * _tiles(product.shape[-2], GEMM_TILE) * _tiles(product.shape[-1], GEMM_TILE)
    if op.kernel in ATTENTION_CLASSES:
        # forward: q [batch, heads, L_q, d] (args[0]); backward: over key tiles, k (args[2]).
        rows = args[0] if op.kernel == KernelClass.ATTENTION_FWD else args[2]
        if isinstance(rows, torch.Tensor) and rows.dim() == 4:
            return rows.shape[0] * rows.shape[1] * _tiles(rows.shape[2], ATTENTION_TILE)
    return 0


def lanes(op: AtenOp, outputs: list[torch.Tensor]) -> int:
    """Threads of a kernel that walks a chain of loads per output element: ``embedding_bag``'s CUDA kernel
    (EmbeddingBag.cu ``EmbeddingBag_updateOutputKernel_sum_mean``) gives each element of a bag's output row one
    thread, which loops over the bag's indices: 32 bags of 8,192 rows of 128 run on 4,096 threads, each reading
    8,192 values one index after another. 0 for every other kernel."""
    if op.gathers == Gather.BAGS and outputs:
        return max(1, outputs[0].numel())
    return 0


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _gathered_bytes(op: AtenOp, args, outputs: list[torch.Tensor]) -> int | None:
    """What a gather reads of its source (the first argument): the elements it selects (None: not a gather)."""
    source = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if source is None:
        return None
    if op.gathers == Gather.ROWS:
        selected = outputs[0].numel() if outputs else 0
    elif op.gathers == Gather.BAGS and len(args) > 1 and isinstance(args[1], torch.Tensor):
        selected = args[1].numel() * (source.shape[-1] if source.dim() else 1)  # one row per index
    else:
        return None
    return min(nbytes(source), selected * source.element_size())


def dtype_of(tensors: list[torch.Tensor]) -> str:
    """The dtype whose peak bounds a kernel of these tensors: the first floating one's ("half" for 16 bits)."""
    for t in tensors:
        if t.dtype in (torch.float16, torch.bfloat16):
            return "half"
        if t.dtype == torch.float64:
            return "float64"
        if t.dtype.is_floating_point:
            return "float32"
    return "float32"


def _argument(func, args, kwargs, name: str):
    """The value of ``func``'s argument ``name`` in this call (None when absent)."""
    if name in (kwargs or {}):
        return kwargs[name]
    for index, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            return args[index] if index < len(args) else argument.default_value
    return None


def _flops(func, args, kwargs, out, kind: KernelClass) -> float:
    if kind not in (KernelClass.GEMM, *ATTENTION_CLASSES):  # the formulas flop_counter has are of these
        return 0.0
    count = flop_registry.get(func._overloadpacket)
    if count is None:
        return 0.0
    flops = float(count(*args, **(kwargs or {}), out_val=out))
    if kind in ATTENTION_CLASSES and _argument(func, args, kwargs, "is_causal"):  # SDPA's: top-left aligned
        query, key = (args[0], args[1]) if kind == KernelClass.ATTENTION_FWD else (args[1], args[2])
        flops *= causal_share(query.shape[-2], key.shape[-2], offset=0)
    return flops


@functools.cache
def _warn_undeclared(qualified_name: str) -> None:
    warnings.warn(
        f"custom op {qualified_name} declares no cost (topk_bench.predict.timing.register_cost): "
        "its time is predicted from its bytes, as an elementwise kernel's",
        RuntimeWarning,
        stacklevel=3,
    )


@functools.cache
def _launch_of(func) -> AtenOp | None:
    """The catalogue's entry of the kernel ``func`` launches, None for none: once per op overload."""
    return catalogued(func) if launches_kernel(func) else None


def _declared_kernels(func, args, kwargs, dtype: str, host_ops: int) -> list[Kernel] | None:
    """The kernels a custom op's declaration lists (None: it declares none)."""
    rule = declared_cost(f"{func.namespace}::{func._opname}")
    if rule is None:
        return None
    declared = rule(args, kwargs)
    chain: tuple[Cost, ...] = declared if isinstance(declared, tuple) else (declared,)
    return [
        Kernel(func._opname, c.kind, float(c.flops), float(c.bytes), dtype, blocks=c.blocks, lanes=c.lanes,
               host_ops=host_ops if i == 0 else 1, round_trips=c.round_trips)
        for i, c in enumerate(chain)
    ]  # fmt: skip


def kernels(func, args, kwargs, out, host_ops: int = 1) -> list[Kernel]:
    """The kernels one call of ``func`` launches: none for a view or an allocation, one for an aten op, those its
    declaration lists for a custom op (:func:`register_cost`); ``host_ops``: the ops the host dispatched since
    the previous kernel, this one included (the first kernel's; each later kernel of a chain is one more call on
    the host: a Triton kernel is launched from Python, as an op is dispatched)."""
    op = _launch_of(func)
    if op is None:
        return []
    inputs, outputs = _tensors((args, kwargs)), _tensors(out)
    dtype = dtype_of(inputs or outputs)
    if func.namespace != "aten":
        declared = _declared_kernels(func, args, kwargs or {}, dtype, host_ops)
        if declared is not None:
            return declared
        _warn_undeclared(f"{func.namespace}::{func._opname}")
    moved = sum(nbytes(t) for t in inputs) + sum(nbytes(t) for t in outputs)  # in place: read, written
    gathered = _gathered_bytes(op, args, outputs)
    if gathered is not None:
        moved += gathered - nbytes(args[0])
    flops = _flops(func, args, kwargs, out, op.kernel)
    return [
        Kernel(op.name, op.kernel, flops, float(moved), dtype, blocks(op, args, outputs), lanes(op, outputs), host_ops)
    ]


class KernelCosts(OpCounter):
    """The op counter (``counted``: ops, launches, SDPA's backend) that also records the kernels the ops launch
    (:attr:`kernels`, in order): one dispatch mode for both, so that the time model costs little."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels: list[Kernel] = []
        self._dispatched = 0  # ops since the last kernel

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if is_iteration_op(func):
            self._dispatched += 1
            launched = kernels(func, args, kwargs, out, self._dispatched)
            self.counted.note(func._opname, len(launched))
            if launched:
                self.kernels += launched
                self._dispatched = 0
        return out


# -- the constants -------------------------------------------------------------------------------------------


class BlockGroup(Word):
    """The kernels whose bandwidth their blocks bound, by what one block streams: a GEMM's (cuBLAS, CUTLASS) and a
    fused attention kernel's (forward and backward alike: one pipeline of tiles)."""

    GEMM = "gemm"
    ATTENTION = "attention"


_BLOCK_GROUP = {
    KernelClass.GEMM: BlockGroup.GEMM,
    KernelClass.ATTENTION_FWD: BlockGroup.ATTENTION,
    KernelClass.ATTENTION_BWD: BlockGroup.ATTENTION,
}


@dataclass(frozen=True)
class Constants:
    """The global constants of the time model: an achieved fraction of the peak per kernel class, the bandwidth
    one block of a GEMM or of an attention kernel streams, the bandwidth one thread walking a chain of loads
    reads, the least time a kernel takes on the device, the host's cost of one launch (eager PyTorch: Python,
    the dispatcher, the launch)."""

    efficiency: dict[KernelClass, float] = field(default_factory=lambda: dict.fromkeys(KernelClass, 0.5))
    block_bytes_per_s: dict[BlockGroup, float] = field(default_factory=lambda: dict.fromkeys(BlockGroup, 50e9))
    lane_bytes_per_s: float = 10e6
    floor_s: float = 3e-6
    launch_s: float = 1e-5
    op_s: float = 2e-6  # the host's cost of dispatching any op, a view as a kernel (Python, the dispatcher)

    @classmethod
    def from_json(cls, data: dict) -> Constants:
        """The constants as ``gpu_time.json`` states them (its ``constants``), each read by its name."""
        scalars = {
            f.name: float(data[f.name]) for f in fields(cls) if f.name not in ("efficiency", "block_bytes_per_s")
        }
        return cls(
            efficiency={KernelClass(name): float(v) for name, v in data["efficiency"].items()},
            block_bytes_per_s={BlockGroup(name): float(v) for name, v in data["block_bytes_per_s"].items()},
            **scalars,
        )

    @classmethod
    @functools.cache
    def fitted(cls, path: Path = FITTED) -> Constants:
        """The constants ``scripts/fit_gpu_time.py`` wrote (its defaults when there is no file), read once."""
        return cls.from_json(json.loads(path.read_text())["constants"]) if path.exists() else cls()

    def as_dict(self) -> dict:
        return asdict(self)


def peak_flops(gpu: Gpu, dtype: str, kind: KernelClass) -> float:
    """FLOP/s a kernel of ``kind`` in ``dtype`` is bounded by on ``gpu``: tensor cores for half GEMMs and
    attention, the CUDA cores for float32 (TF32 off) and float64."""
    if dtype == "half":
        return gpu.tensor_half if kind in (KernelClass.GEMM, *ATTENTION_CLASSES) else gpu.fp32
    if dtype == "float64":
        return gpu.fp64
    return gpu.fp32


# -- the time of an iteration ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelTable:
    """An iteration's kernels on one part, as arrays (one entry a kernel, in launch order): what
    :func:`device_seconds` needs, computed once, so that a fit can cost them under many constants."""

    kind: np.ndarray  # index into CLASSES, the kernel classes in order
    compute_s: np.ndarray  # FLOPs / the peak of its dtype on the part (all SMs, efficiency 1)
    bytes: np.ndarray
    blocks: np.ndarray  # 0: enough for every SM
    lanes: np.ndarray  # 0: no chain of loads
    host_ops: np.ndarray  # ops dispatched before it since the previous kernel, itself included
    round_trips: np.ndarray  # its longest program's dependent round trips (0: none declared)

    @classmethod
    def of(cls, kernels: Iterable[Kernel], gpu: Gpu) -> KernelTable:
        ks = list(kernels)
        index = {c: i for i, c in enumerate(CLASSES)}
        return cls(
            np.array([index[k.kind] for k in ks], dtype=np.int64),
            np.array([k.flops / peak_flops(gpu, k.dtype, k.kind) for k in ks], dtype=float),
            np.array([k.bytes for k in ks], dtype=float),
            np.array([k.blocks for k in ks], dtype=float),
            np.array([k.lanes for k in ks], dtype=float),
            np.array([k.host_ops for k in ks], dtype=float),
            np.array([k.round_trips for k in ks], dtype=float),
        )

    def __len__(self) -> int:
        return len(self.kind)


# What one dependent load of the chains ``lane_bytes_per_s`` was fitted on reads: one element of embedding_bag's
# weight a step, float32 in most of the fitted rows (bfloat16 in the CUDA-graph decode steps). A round trip takes
# CHAIN_LOAD_BYTES / lane_bytes_per_s: 0.81 us with the H100 fit.
CHAIN_LOAD_BYTES = 4


def device_seconds(table: KernelTable, gpu: Gpu, constants: Constants) -> np.ndarray:
    """Each kernel's time on the device: ``floor + max(compute, memory) + round trips`` (the module's
    docstring)."""
    efficiency = np.array([constants.efficiency[c] for c in CLASSES])[table.kind]
    tiled = table.blocks > 0
    busy = np.where(tiled, np.minimum(1.0, table.blocks / gpu.sm_count), 1.0)
    compute = table.compute_s / (efficiency * busy)
    per_block = np.array(
        [constants.block_bytes_per_s[_BLOCK_GROUP[c]] if c in _BLOCK_GROUP else np.inf for c in CLASSES]
    )
    blocks_cap = np.where(tiled, table.blocks, np.inf) * per_block[table.kind]
    lanes_cap = np.where(table.lanes > 0, table.lanes, np.inf) * constants.lane_bytes_per_s
    bandwidth = np.minimum(gpu.hbm_bytes_per_s * efficiency, np.minimum(blocks_cap, lanes_cap))
    waits = table.round_trips * (CHAIN_LOAD_BYTES / constants.lane_bytes_per_s)
    return constants.floor_s + np.maximum(compute, table.bytes / bandwidth) + waits


def host_seconds(table: KernelTable, constants: Constants) -> np.ndarray:
    """What the host spends issuing each kernel: the ops it dispatched since the previous one (views too) and
    the launch."""
    return table.host_ops * constants.op_s + constants.launch_s


def stream_seconds(device: np.ndarray, host: np.ndarray) -> float:
    """An eager iteration: kernel ``i`` starts when the host has issued it (``host[0] + ... + host[i]``) and
    kernel ``i - 1`` has ended; the iteration ends with the last. In closed form, the latest of kernel ``i``'s
    issue plus the device time of kernels ``i`` onwards."""
    if len(device) == 0:
        return 0.0
    issued = np.cumsum(host)
    remaining = np.cumsum(device[::-1])[::-1]
    return float(np.max(issued + remaining))


@dataclass(frozen=True)
class Estimate:
    device_s: float  # the kernels one after another: a CUDA graph's replay
    host_s: float  # the host's dispatches and launches
    launches: int
    eager_s: float  # the stream fed by the host (stream_seconds): at least the larger of the two

    @property
    def host_bound(self) -> bool:
        return self.host_s > self.device_s


def estimate(kernels: Iterable[Kernel], gpu: Gpu, constants: Constants | None = None) -> Estimate:
    """The time of one iteration of ``kernels`` on ``gpu``."""
    constants = constants or Constants.fitted()
    table = KernelTable.of(kernels, gpu)
    device, host = device_seconds(table, gpu, constants), host_seconds(table, constants)
    return Estimate(float(device.sum()), float(host.sum()), len(table), stream_seconds(device, host))


def kernel_seconds(k: Kernel, gpu: Gpu, constants: Constants) -> float:
    """One kernel's time on the device (:func:`device_seconds` of a table of one)."""
    return float(device_seconds(KernelTable.of([k], gpu), gpu, constants)[0])


def columns(predicted: Estimate) -> dict:
    """A predicted row's time columns (topk_bench.results.columns)."""
    from topk_bench.results import columns as col

    return {
        col.TIME_PREDICTED_S: predicted.eager_s,
        col.DEVICE_TIME_PREDICTED_S: predicted.device_s,
        col.HOST_BOUND: predicted.host_bound,
    }
