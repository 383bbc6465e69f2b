"""Predicted time on a GPU the machine does not have: a cost per kernel of the fake run, summed.

The fake run of a CUDA prediction dispatches the ops CUDA would, with their shapes and dtypes.
:class:`KernelCosts` records, for every op that launches a kernel (not a view, not an allocation:
:func:`topk_bench.measure.ops.launches_kernel`), its class, FLOPs and bytes:

- FLOPs: ``torch.utils.flop_counter``'s formulas (matmuls, SDPA's kernels); a fused attention kernel with
  ``is_causal`` skips the masked tiles, so its FLOPs are scaled by the share of the score matrix a causal mask
  keeps (top-left aligned, as SDPA's ``is_causal``);
- bytes: what the kernel reads and writes, its tensor inputs and outputs at their sizes (an expanded input
  counted at its storage's size, an input that is also the output once each way);
- the class (:data:`CLASSES`): GEMM, SDPA forward, SDPA backward, elementwise and reductions, top-k and sort,
  gathers and scatters.

A kernel takes ``floor + max(FLOPs / peak, bytes / bandwidth) / (busy x efficiency[class])`` on the device:
the part's peak for the kernel's dtype (:class:`~topk_bench.predict.kernels.gpus.Gpu`: float32 GEMMs on the
CUDA cores, as the harness keeps TF32 off; half on the tensor cores), its memory bandwidth, ``busy`` the share
of the SMs the kernel's thread blocks fill (a GEMM's output tiles, an attention kernel's row tiles:
:func:`blocks`; at most one), and the achieved fraction of the peak its class reaches. The iteration's device
time is the sum over its kernels (one stream, no overlap); the host's is kernel launches times the cost of one
(Python, the dispatcher, the launch); an eager iteration takes the larger of the two, a CUDA graph's replay the
device time.

The efficiencies, the floor and the launch cost (:class:`Constants`) are global, one per class: fitted once by
``scripts/fit_gpu_time.py`` on part of the committed H100 rows and judged on the rest, written to
``gpu_time.json`` beside this module (docs/predicting.md quotes how far off it is, and where).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

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


@dataclass(frozen=True)
class Kernel:
    op: str
    kind: str  # one of CLASSES
    flops: float
    bytes: float
    dtype: str  # the dtype whose peak bounds it: "float32", "half", "float64"
    blocks: int = 0  # thread blocks it runs in parallel, where the kernel's tiling says (0: enough for every SM)


# The output tile one thread block of a GEMM computes (CUTLASS's and cuBLAS's usual 128 x 128), and the query
# (forward) or key (backward) rows one block of a fused attention kernel takes: a kernel of fewer blocks than
# the part has SMs leaves the others idle (a decode step's product over 131,072 keys into 8 x 4 x 128 outputs
# runs on 8 of 132 SMs).
GEMM_TILE = 128
ATTENTION_TILE = 64


def _tiles(n: int, tile: int) -> int:
    return max(1, -(-int(n) // tile))


def blocks(name: str, kind: str, args, out) -> int:
    """Thread blocks of a GEMM (output tiles x batch) or a fused attention kernel (batch x heads x row tiles)."""
    tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    if kind == GEMM and tensors and name in ("mm", "bmm", "addmm", "baddbmm") and tensors[0].dim() >= 2:
        product = tensors[0]
        batch = math.prod(product.shape[:-2])
        return batch * _tiles(product.shape[-2], GEMM_TILE) * _tiles(product.shape[-1], GEMM_TILE)
    if kind in (ATTENTION_FWD, ATTENTION_BWD):
        # forward: q [batch, heads, L_q, d] (args[0]); backward: over key tiles, k (args[2]).
        rows = args[0] if kind == ATTENTION_FWD else args[2]
        if isinstance(rows, torch.Tensor) and rows.dim() == 4:
            return rows.shape[0] * rows.shape[1] * _tiles(rows.shape[2], ATTENTION_TILE)
    return 0


def causal_share(q_len: int, k_len: int) -> float:
    """The share of a [q_len, k_len] score matrix a top-left causal mask keeps (query i sees keys 0..i)."""
    if q_len <= 0 or k_len <= 0:
        return 1.0
    kept = sum(min(i + 1, k_len) for i in range(min(q_len, k_len))) + max(0, q_len - k_len) * k_len
    return kept / (q_len * k_len)


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _nbytes(t: torch.Tensor) -> int:
    """What a kernel touches of ``t``: its elements, at most its storage (an expanded tensor reads its storage)."""
    size = t.numel() * t.element_size()
    try:
        return min(size, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # a tensor with no storage (sparse): its elements
        return size


def _dtype(tensors: list[torch.Tensor]) -> str:
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


@functools.cache
def _launch_of(func) -> tuple[str, str] | None:
    """(name, class) of the kernel ``func`` launches, None for none: once per op overload."""
    return (func._opname, kernel_class(func._opname)) if launches_kernel(func) else None


def kernel(func, args, kwargs, out) -> Kernel | None:
    """The kernel one call of ``func`` launches (None: none, a view or an allocation)."""
    launched = _launch_of(func)
    if launched is None:
        return None
    name, kind = launched
    inputs, outputs = _tensors((args, kwargs)), _tensors(out)
    moved = sum(_nbytes(t) for t in inputs + outputs)  # an in-place op's output is its input: read, written
    return Kernel(
        name,
        kind,
        _flops(func, args, kwargs, out, kind),
        float(moved),
        _dtype(inputs or outputs),
        blocks(name, kind, args, out),
    )


class KernelCosts(OpCounter):
    """The op counter (``counted``: ops, launches, SDPA's backend) that also records the kernels the ops launch
    (:attr:`kernels`, in order): one dispatch mode for both, so that the time model costs little."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels: list[Kernel] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace != "prim":  # as OpCounter: C++ asking a tensor its device is no op of the iteration
            launched = kernel(func, args, kwargs, out)
            self.counted.note(func._opname, launched is not None)
            if launched is not None:
                self.kernels.append(launched)
        return out


@dataclass(frozen=True)
class Constants:
    """The global constants of the time model: an achieved fraction of the peak per kernel class, the least time
    a kernel takes on the device, the host's cost of one launch (eager PyTorch: Python, dispatcher, launch)."""

    efficiency: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0.5))
    floor_s: float = 3e-6
    launch_s: float = 1e-5

    @classmethod
    def fitted(cls, path: Path = FITTED) -> Constants:
        """The constants ``scripts/fit_gpu_time.py`` wrote (its defaults when there is no file)."""
        if not path.exists():
            return cls()
        data = json.loads(path.read_text())["constants"]
        return cls(dict(data["efficiency"]), float(data["floor_s"]), float(data["launch_s"]))

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


@dataclass(frozen=True)
class Estimate:
    device_s: float  # the kernels one after another: a CUDA graph's replay
    host_s: float  # launches x the launch cost
    launches: int

    @property
    def eager_s(self) -> float:
        """An eager iteration: the host and the device overlap, the slower one sets the pace."""
        return max(self.device_s, self.host_s)

    @property
    def host_bound(self) -> bool:
        return self.host_s > self.device_s


def busy_share(k: Kernel, gpu: Gpu) -> float:
    """The share of the part's SMs a kernel keeps busy: its blocks over the SMs, at most all of them."""
    return min(1.0, k.blocks / gpu.sm_count) if k.blocks else 1.0


def kernel_seconds(k: Kernel, gpu: Gpu, constants: Constants) -> float:
    roofline = max(k.flops / peak_flops(gpu, k.dtype, k.kind), k.bytes / gpu.hbm_bytes_per_s) / busy_share(k, gpu)
    return constants.floor_s + roofline / constants.efficiency[k.kind]


def estimate(kernels: Iterable[Kernel], gpu: Gpu, constants: Constants | None = None) -> Estimate:
    """The time of one iteration of ``kernels`` on ``gpu``."""
    constants = constants or Constants.fitted()
    device, launches = 0.0, 0
    for k in kernels:
        device += kernel_seconds(k, gpu, constants)
        launches += 1
    return Estimate(device, launches * constants.launch_s, launches)


def columns(predicted: Estimate) -> dict:
    """A predicted row's time columns (topk_bench.results.columns)."""
    from topk_bench.results import columns as col

    return {
        col.TIME_PREDICTED_S: predicted.eager_s,
        col.DEVICE_TIME_PREDICTED_S: predicted.device_s,
        col.HOST_BOUND: predicted.host_bound,
    }
