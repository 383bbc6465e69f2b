"""Predicted time on a GPU the machine does not have: a cost per kernel of the fake run, run through one stream.

The fake run of a CUDA prediction dispatches the ops CUDA would, with their shapes and dtypes.
:class:`KernelCosts` records, for every op that launches a kernel (not a view, not an allocation:
:func:`topk_bench.measure.ops.launches_kernel`), its class, FLOPs, bytes and parallelism:

- FLOPs: ``torch.utils.flop_counter``'s formulas (matmuls, SDPA's kernels); a fused attention kernel with
  ``is_causal`` skips the masked tiles, so its FLOPs are scaled by the share of the score matrix a causal mask
  keeps (top-left aligned, as SDPA's ``is_causal``); a custom op (a Triton kernel) declares its own
  (:func:`register_cost`: ``flop_counter`` knows no custom op);
- bytes: what the kernel reads and writes, its tensor inputs and outputs at their sizes (an expanded input
  counted at its storage's size, an input that is also the output once each way); a gather reads of its source
  only the rows it selects (``index_select``, ``embedding_bag``: not the whole table);
- parallelism: the thread blocks of a tiled kernel (a GEMM's output tiles, an attention kernel's row tiles:
  :func:`blocks`), or the threads of a kernel that walks a chain per output element (``embedding_bag``: one
  thread per output element loops over its bag, :func:`lanes`);
- the class (:data:`CLASSES`): GEMM, SDPA forward, SDPA backward, elementwise and reductions, top-k and sort,
  gathers and scatters.

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
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from topk_bench.measure.ops import OpCounter, launches_kernel
from topk_bench.predict.kernels.gpus import Gpu

FITTED = Path(__file__).with_name("gpu_time.json")

GEMM, ATTENTION_FWD, ATTENTION_BWD, ELEMENTWISE, SELECTION, INDEXING = (
    "gemm",
    "attention_fwd",
    "attention_bwd",
    "elementwise",
    "selection",
    "indexing",
)
CLASSES = (GEMM, ATTENTION_FWD, ATTENTION_BWD, ELEMENTWISE, SELECTION, INDEXING)

_GEMM_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "_scaled_mm", "convolution"})
_SDPA = (
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward",
    "_efficient_attention_forward",
)
_ATTENTION_FWD_OPS = frozenset(_SDPA)
_ATTENTION_BWD_OPS = frozenset(f"{name}_backward" for name in _SDPA)
_SELECTION_OPS = frozenset({"topk", "sort", "argsort", "kthvalue", "median", "unique", "_unique2", "msort"})
_INDEXING_OPS = frozenset(
    {
        "index",
        "index_select",
        "gather",
        "scatter",
        "scatter_",
        "scatter_add",
        "scatter_add_",
        "scatter_reduce",
        "scatter_reduce_",
        "index_put",
        "index_put_",
        "_index_put_impl_",
        "index_add",
        "index_add_",
        "index_copy",
        "index_copy_",
        "take",
        "masked_select",
        "masked_scatter",
        "nonzero",
        "embedding",
        "embedding_dense_backward",
        "_embedding_bag",
        "_embedding_bag_forward_only",
        "_embedding_bag_backward",
        "_embedding_bag_dense_backward",
        "gather_backward",
        "index_select_backward",
    }
)


def kernel_class(name: str) -> str:
    """The class of the kernel an aten op (by name, without namespace or overload) launches."""
    if name in _GEMM_OPS:
        return GEMM
    if name in _ATTENTION_FWD_OPS:
        return ATTENTION_FWD
    if name in _ATTENTION_BWD_OPS:
        return ATTENTION_BWD
    if name in _SELECTION_OPS:
        return SELECTION
    if name in _INDEXING_OPS:
        return INDEXING
    return ELEMENTWISE


# Gathers: what they read of their source (the first tensor argument) is the rows they select, not the source.
_GATHER_OPS = frozenset({"index", "index_select", "gather", "take", "embedding"})
_EMBEDDING_BAG_OPS = frozenset({"_embedding_bag", "_embedding_bag_forward_only"})


@dataclass(frozen=True)
class Kernel:
    op: str
    kind: str  # one of CLASSES
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


def blocks(name: str, kind: str, args, outputs: list[torch.Tensor]) -> int:
    """Thread blocks of a GEMM (output tiles x batch) or a fused attention kernel (batch x heads x row tiles)."""
    if kind == GEMM and outputs and name in ("mm", "bmm", "addmm", "baddbmm") and outputs[0].dim() >= 2:
        product = outputs[0]
        batch = math.prod(product.shape[:-2])
        return batch * _tiles(product.shape[-2], GEMM_TILE) * _tiles(product.shape[-1], GEMM_TILE)
    if kind in (ATTENTION_FWD, ATTENTION_BWD):
        # forward: q [batch, heads, L_q, d] (args[0]); backward: over key tiles, k (args[2]).
        rows = args[0] if kind == ATTENTION_FWD else args[2]
        if isinstance(rows, torch.Tensor) and rows.dim() == 4:
            return rows.shape[0] * rows.shape[1] * _tiles(rows.shape[2], ATTENTION_TILE)
    return 0


def lanes(name: str, outputs: list[torch.Tensor]) -> int:
    """Threads of a kernel that walks a chain of loads per output element: ``embedding_bag``'s CUDA kernel
    (EmbeddingBag.cu ``EmbeddingBag_updateOutputKernel_sum_mean``) gives each element of a bag's output row one
    thread, which loops over the bag's indices: 32 bags of 8,192 rows of 128 run on 4,096 threads, each reading
    8,192 values one index after another. 0 for every other kernel."""
    if name in _EMBEDDING_BAG_OPS and outputs:
        return max(1, outputs[0].numel())
    return 0


def causal_share(q_len: int, k_len: int) -> float:
    """The share of a [q_len, k_len] score matrix a top-left causal mask keeps (query i sees keys 0..i)."""
    if q_len <= 0 or k_len <= 0:
        return 1.0
    kept = sum(min(i + 1, k_len) for i in range(min(q_len, k_len))) + max(0, q_len - k_len) * k_len
    return kept / (q_len * k_len)


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def nbytes(t: torch.Tensor) -> int:
    """What a kernel touches of ``t``: its elements, at most its storage (an expanded tensor reads its storage)."""
    size = t.numel() * t.element_size()
    try:
        return min(size, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # a tensor with no storage (sparse): its elements
        return size


def _gathered_bytes(name: str, args, outputs: list[torch.Tensor]) -> int | None:
    """What a gather reads of its source (the first argument): the elements it selects (None: not a gather)."""
    source = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if source is None:
        return None
    if name in _GATHER_OPS:
        selected = outputs[0].numel() if outputs else 0
    elif name in _EMBEDDING_BAG_OPS and len(args) > 1 and isinstance(args[1], torch.Tensor):
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


def _flops(func, args, kwargs, out, kind: str) -> float:
    if kind not in (GEMM, ATTENTION_FWD, ATTENTION_BWD):  # the formulas flop_counter has are of these
        return 0.0
    count = flop_registry.get(func._overloadpacket)
    if count is None:
        return 0.0
    flops = float(count(*args, **(kwargs or {}), out_val=out))
    if kind in (ATTENTION_FWD, ATTENTION_BWD) and _argument(func, args, kwargs, "is_causal"):
        query, key = (args[0], args[1]) if kind == ATTENTION_FWD else (args[1], args[2])
        flops *= causal_share(query.shape[-2], key.shape[-2])
    return flops


# -- custom ops (Triton kernels): their costs, declared ------------------------------------------------------


@dataclass(frozen=True)
class Cost:
    """What a custom op's kernel costs, as its declaration computes it from one call's arguments."""

    kind: str  # one of CLASSES
    flops: float
    bytes: float
    blocks: int = 0
    lanes: int = 0
    round_trips: int = 0  # the longest program's loads that each wait for the one before (a serial loop)


# (args, kwargs) of one call -> its Cost, or one Cost per kernel of an op that launches a chain of them
CostRule = Callable[..., "Cost | tuple[Cost, ...]"]
_DECLARED: dict[str, CostRule] = {}
# The module whose import declares the custom ops of implementations/ (which imports nothing of the harness).
DECLARATIONS = "topk_bench.predict.custom_op_costs"


def register_cost(qualified_name: str) -> Callable[[CostRule], CostRule]:
    """Declare the cost of custom op ``namespace::name`` (``torch.utils.flop_counter`` knows none): ``rule(args,
    kwargs)`` of one call returns its :class:`Cost`. The ops of implementations/ are declared in
    :data:`DECLARATIONS`; another package's op is declared wherever it is registered."""

    def declare(rule: CostRule) -> CostRule:
        _DECLARED[qualified_name] = rule
        return rule

    return declare


@functools.cache
def _declarations_loaded() -> bool:
    import importlib

    importlib.import_module(DECLARATIONS)
    return True


def declared_cost(qualified_name: str) -> CostRule | None:
    _declarations_loaded()
    return _DECLARED.get(qualified_name)


@functools.cache
def _warn_undeclared(qualified_name: str) -> None:
    warnings.warn(
        f"custom op {qualified_name} declares no cost (topk_bench.predict.timing.register_cost): "
        "its time is predicted from its bytes, as an elementwise kernel's",
        RuntimeWarning,
        stacklevel=3,
    )


@functools.cache
def _launch_of(func) -> tuple[str, str] | None:
    """(name, class) of the kernel ``func`` launches, None for none: once per op overload."""
    return (func._opname, kernel_class(func._opname)) if launches_kernel(func) else None


def kernels(func, args, kwargs, out, host_ops: int = 1) -> list[Kernel]:
    """The kernels one call of ``func`` launches: none for a view or an allocation, one for an aten op, those its
    declaration lists for a custom op (:func:`register_cost`); ``host_ops``: the ops the host dispatched since
    the previous kernel, this one included (the first kernel's; each later kernel of a chain is one more call on
    the host: a Triton kernel is launched from Python, as an op is dispatched)."""
    launched = _launch_of(func)
    if launched is None:
        return []
    name, kind = launched
    inputs, outputs = _tensors((args, kwargs)), _tensors(out)
    dtype = dtype_of(inputs or outputs)
    if func.namespace != "aten":
        qualified = f"{func.namespace}::{name}"
        rule = declared_cost(qualified)
        if rule is not None:
            declared = rule(args, kwargs or {})
            chain = declared if isinstance(declared, tuple) else (declared,)
            return [
                Kernel(
                    name,
                    c.kind,
                    float(c.flops),
                    float(c.bytes),
                    dtype,
                    blocks=c.blocks,
                    lanes=c.lanes,
                    host_ops=host_ops if i == 0 else 1,
                    round_trips=c.round_trips,
                )
                for i, c in enumerate(chain)
            ]
        _warn_undeclared(qualified)
    moved = sum(nbytes(t) for t in inputs) + sum(nbytes(t) for t in outputs)  # in place: read, written
    chained = 0
    if kind == INDEXING:
        gathered = _gathered_bytes(name, args, outputs)
        if gathered is not None:
            moved += gathered - nbytes(args[0])
        chained = lanes(name, outputs)
    return [
        Kernel(
            name,
            kind,
            _flops(func, args, kwargs, out, kind),
            float(moved),
            dtype,
            blocks(name, kind, args, outputs),
            chained,
            host_ops,
        )
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
        if func.namespace != "prim":  # as OpCounter: C++ asking a tensor its device is no op of the iteration
            self._dispatched += 1
            launched = kernels(func, args, kwargs, out, self._dispatched)
            self.counted.note(func._opname, len(launched))
            if launched:
                self.kernels += launched
                self._dispatched = 0
        return out


# -- the constants -------------------------------------------------------------------------------------------

# The kernels whose bandwidth their blocks bound, by what one block streams: a GEMM's (cuBLAS, CUTLASS) and a
# fused attention kernel's (forward and backward alike: one pipeline of tiles).
GEMM_BLOCK, ATTENTION_BLOCK = "gemm", "attention"
_BLOCK_GROUP = {GEMM: GEMM_BLOCK, ATTENTION_FWD: ATTENTION_BLOCK, ATTENTION_BWD: ATTENTION_BLOCK}
BLOCK_GROUPS = (GEMM_BLOCK, ATTENTION_BLOCK)


@dataclass(frozen=True)
class Constants:
    """The global constants of the time model: an achieved fraction of the peak per kernel class, the bandwidth
    one block of a GEMM or of an attention kernel streams, the bandwidth one thread walking a chain of loads
    reads, the least time a kernel takes on the device, the host's cost of one launch (eager PyTorch: Python,
    the dispatcher, the launch)."""

    efficiency: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0.5))
    block_bytes_per_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BLOCK_GROUPS, 50e9))
    lane_bytes_per_s: float = 10e6
    floor_s: float = 3e-6
    launch_s: float = 1e-5
    op_s: float = 2e-6  # the host's cost of dispatching any op, a view as a kernel (Python, the dispatcher)

    @classmethod
    def fitted(cls, path: Path = FITTED) -> Constants:
        """The constants ``scripts/fit_gpu_time.py`` wrote (its defaults when there is no file)."""
        if not path.exists():
            return cls()
        data = json.loads(path.read_text())["constants"]
        return cls(
            dict(data["efficiency"]),
            dict(data["block_bytes_per_s"]),
            float(data["lane_bytes_per_s"]),
            float(data["floor_s"]),
            float(data["launch_s"]),
            float(data["op_s"]),
        )

    def as_dict(self) -> dict:
        return asdict(self)


def peak_flops(gpu: Gpu, dtype: str, kind: str) -> float:
    """FLOP/s a kernel of ``kind`` in ``dtype`` is bounded by on ``gpu``: tensor cores for half GEMMs and
    attention, the CUDA cores for float32 (TF32 off) and float64."""
    if dtype == "half":
        return gpu.tensor_half if kind in (GEMM, ATTENTION_FWD, ATTENTION_BWD) else gpu.fp32
    if dtype == "float64":
        return gpu.fp64
    return gpu.fp32


# -- the time of an iteration ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelTable:
    """An iteration's kernels on one part, as arrays (one entry a kernel, in launch order): what
    :func:`device_seconds` needs, computed once, so that a fit can cost them under many constants."""

    kind: np.ndarray  # index into CLASSES
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
    per_block = np.array([constants.block_bytes_per_s.get(_BLOCK_GROUP.get(c, ""), np.inf) for c in CLASSES])
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
