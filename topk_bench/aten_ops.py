"""The aten ops the harness knows, each named once with what the models need of it: its family, whether it launches
a kernel on CUDA, the class of that kernel's time.

Three readers, one table (:data:`CATALOGUE`):

- the memory model (:mod:`topk_bench.predict.kernels.registry`): an op whose CUDA kernel allocates its outputs and
  nothing else (``outputs_only``) needs no rule, the fake run already allocates what CUDA does;
- the time model (:mod:`topk_bench.predict.timing`): the kernel's class (:class:`KernelClass`) prices it, a gather
  reads of its source the rows it selects (``gathers``), a GEMM of two matrices runs on its output's tiles;
- the op counter (:mod:`topk_bench.measure.ops`): which ops launch a kernel (``launches``), and which SDPA backend an
  op names (``sdpa_backend``).

An op is named as ``func._opname`` spells it (no namespace, no overload: ``mm``, ``add_``). An op the catalogue does
not list launches a kernel unless its schema makes it a view, is timed as an elementwise kernel, and a CUDA
prediction names it among the ops whose allocations no rule models.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from topk_bench.types import Word


class KernelClass(Word):
    """The class of a kernel in the time model: each has its own achieved share of the part's peak."""

    GEMM = "gemm"
    ATTENTION_FWD = "attention_fwd"
    ATTENTION_BWD = "attention_bwd"
    ELEMENTWISE = "elementwise"  # elementwise, reductions, copies: every kernel not of another class
    SELECTION = "selection"  # top-k and sort
    INDEXING = "indexing"  # gathers and scatters


class Family(Word):
    """What kind of op it is, as a reader of the CUDA sources groups them."""

    VIEWS = "views"  # metadata over an input's storage
    ALLOCATIONS = "allocations"  # storage from the caching allocator, no kernel
    METADATA = "metadata"  # questions about tensors and dtypes, answered on the host
    FACTORIES = "factories"  # filled or drawn tensors (Distributions*.cu: philox offsets, no buffer)
    ELEMENTWISE = "elementwise"  # TensorIterator's kernels (Loops.cuh) and copies (Copy.cu)
    INDEXING = "indexing"  # gathers, scatters, index kernels (Indexing.cu, ScatterGatherKernel.cu)
    CONCATENATION = "concatenation"  # Shape.cu: input pointers travel in pinned host memory, not on the device
    REDUCTIONS = "reductions"  # Reduce.cuh
    GEMM = "gemm"  # cuBLAS
    ATTENTION = "attention"  # SDPA's fused kernels
    SELECTION = "selection"  # top-k and sort


class Gather(Word):
    """What a gather reads of its source (its first argument): not the whole table."""

    ROWS = "rows"  # the elements it selects: as many as its output has
    BAGS = "bags"  # a row per index, each element of a bag's output one thread walking the bag's indices


@dataclass(frozen=True)
class AtenOp:
    name: str
    family: Family | None  # None: an op the catalogue does not list
    kernel: KernelClass = KernelClass.ELEMENTWISE
    # False: launches no kernel whatever its schema says (an allocation, a question, a view whose schema does not
    # say it is one); True: launches one unless its schema makes it a view.
    launches: bool = True
    # Its CUDA kernel allocates its outputs and nothing else (or scratch below the allocator's granule: a split
    # reduction's staging buffer and semaphores, a few KiB, not modelled): the fake run counts what CUDA does.
    outputs_only: bool = False
    gathers: Gather | None = None
    output_tiles: bool = False  # its thread blocks are its output's tiles (cuBLAS's GEMM of two matrices)
    sdpa_backend: str | None = None  # the SDPA backend that dispatches it, as SDPBackend's members (lower case)


def _ops(family: Family, names: str, **facts) -> dict[str, AtenOp]:
    return {name: AtenOp(name, family, **facts) for name in names.split()}


def _catalogue(*groups: dict[str, AtenOp]) -> Mapping[str, AtenOp]:
    table: dict[str, AtenOp] = {}
    for group in groups:
        for name, op in group.items():
            if name in table:
                raise ValueError(f"aten op {name} is catalogued twice ({table[name].family}, {op.family})")
            table[name] = op
    return MappingProxyType(table)


_VIEWS = """view reshape transpose t expand unsqueeze squeeze permute select slice split split_with_sizes alias
    detach as_strided diagonal narrow unbind unfold _reshape_alias view_as_real lift_fresh_copy _conj _neg_view
    resolve_conj resolve_neg"""
_FACTORIES = """new_zeros new_ones new_full zeros zeros_like ones ones_like full full_like arange scalar_tensor randn
    rand randint uniform_ normal_ bernoulli_ fill_ zero_ tril_ triu_ tril triu"""
_ELEMENTWISE = """add sub mul div neg exp log relu threshold_backward gt ge lt le eq ne bitwise_and bitwise_or
    bitwise_xor bitwise_not bitwise_left_shift bitwise_right_shift __rshift__ __lshift__ __and__ __or__ __xor__ clamp
    clamp_min clamp_max where masked_fill pow remainder floor_divide copy copy_ _to_copy clone abs sqrt rsqrt sigmoid
    tanh logical_not logical_and logical_or maximum minimum sign reciprocal square gelu gelu_backward silu
    silu_backward sigmoid_backward tanh_backward add_ sub_ mul_ div_ exp_ relu_ clamp_ clamp_min_ clamp_max_
    masked_fill_ neg_ sqrt_ pow_ logical_not_ bitwise_and_ bitwise_or_ bitwise_xor_ lerp addcmul addcdiv
    native_dropout native_dropout_backward"""
_REDUCTIONS = """sum mean amax amin max min argmax argmin any all prod linalg_vector_norm norm var std var_mean
    logsumexp cumsum"""
# SDPA's forward ops, by the backend (SDPBackend's member, lower case) that dispatches each; a CUDA prediction never
# dispatches the CPU's and other devices' (the last two), a measurement names them.
_SDPA = {
    "_scaled_dot_product_flash_attention": "flash_attention",
    "_scaled_dot_product_efficient_attention": "efficient_attention",
    "_scaled_dot_product_cudnn_attention": "cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu": "flash_attention",
    "_scaled_dot_product_fused_attention_overrideable": "overrideable",
}

CATALOGUE = _catalogue(
    _ops(Family.VIEWS, _VIEWS, outputs_only=True),
    # _unsafe_view: autograd's view of a fresh result, its schema says it is none; lift_fresh: the tensor itself.
    _ops(Family.VIEWS, "_unsafe_view lift_fresh", outputs_only=True, launches=False),
    _ops(
        Family.ALLOCATIONS,
        "empty empty_like empty_strided new_empty new_empty_strided",
        outputs_only=True,
        launches=False,
    ),
    _ops(Family.ALLOCATIONS, "empty_permuted resize_ set_", launches=False),  # no rule says what CUDA allocates
    _ops(
        Family.METADATA,
        """is_same_size _has_compatible_shallow_copy_type sym_size sym_stride sym_numel
         sym_storage_offset promote_types""",
        launches=False,
    ),
    _ops(Family.FACTORIES, _FACTORIES, outputs_only=True),
    _ops(Family.ELEMENTWISE, _ELEMENTWISE, outputs_only=True),
    _ops(Family.ELEMENTWISE, "_safe_softmax", sdpa_backend="math"),  # only SDPA's math composite calls it
    # Outputs only for these overloads (index_put_ without accumulate goes through TensorIterator, not the
    # sort-based kernel).
    _ops(
        Family.INDEXING,
        "index index_select gather take",
        kernel=KernelClass.INDEXING,
        outputs_only=True,
        gathers=Gather.ROWS,
    ),
    _ops(
        Family.INDEXING,
        """scatter scatter_ scatter_add scatter_add_ scatter_reduce scatter_reduce_ index_put
         index_put_ _index_put_impl_ masked_select_backward""",
        kernel=KernelClass.INDEXING,
        outputs_only=True,
    ),
    _ops(Family.INDEXING, "embedding", kernel=KernelClass.INDEXING, gathers=Gather.ROWS),
    # EmbeddingBag.cu EmbeddingBag_updateOutputKernel_sum_mean: a thread per element of a bag's output row.
    _ops(
        Family.INDEXING, "_embedding_bag _embedding_bag_forward_only", kernel=KernelClass.INDEXING, gathers=Gather.BAGS
    ),
    _ops(
        Family.INDEXING,
        """index_add index_add_ index_copy index_copy_ masked_select masked_scatter nonzero
         embedding_dense_backward _embedding_bag_backward _embedding_bag_dense_backward gather_backward
         index_select_backward""",
        kernel=KernelClass.INDEXING,
    ),
    _ops(
        Family.CONCATENATION,
        """cat stack repeat roll flip constant_pad_nd slice_backward select_backward
         diag_embed""",
        outputs_only=True,
    ),
    _ops(Family.REDUCTIONS, _REDUCTIONS, outputs_only=True),
    _ops(Family.GEMM, "mm bmm addmm baddbmm", kernel=KernelClass.GEMM, output_tiles=True),
    _ops(Family.GEMM, "addbmm addmv mv dot _scaled_mm convolution", kernel=KernelClass.GEMM),
    # SDPA's fused kernels: each op by the backend that dispatches it, and the kernels they call.
    *(_ops(Family.ATTENTION, name, kernel=KernelClass.ATTENTION_FWD, sdpa_backend=b) for name, b in _SDPA.items()),
    _ops(Family.ATTENTION, "_flash_attention_forward _efficient_attention_forward", kernel=KernelClass.ATTENTION_FWD),
    _ops(
        Family.ATTENTION,
        """_scaled_dot_product_flash_attention_backward _scaled_dot_product_efficient_attention_backward
         _scaled_dot_product_cudnn_attention_backward _flash_attention_backward _efficient_attention_backward""",
        kernel=KernelClass.ATTENTION_BWD,
    ),
    _ops(Family.SELECTION, "topk sort argsort kthvalue median _unique2 msort", kernel=KernelClass.SELECTION),
)

# Namespaces of no op of an iteration: the queries C++ makes of a tensor (its device), in decompositions.
QUERY_NAMESPACES = frozenset({"prim"})
# Namespaces of ops that run on the host alone: the profiler's ranges, which stage marks open (no kernel, no
# device memory).
HOST_ONLY_NAMESPACES = frozenset({"profiler"})


@functools.cache
def op(name: str) -> AtenOp:
    """The aten op ``name`` (no namespace, no overload); one the catalogue does not list has no family."""
    return CATALOGUE.get(name) or AtenOp(name, None)


def of(func) -> AtenOp:
    """The catalogue's entry for ``func`` (an op overload): an op of another namespace than aten has no family."""
    return op(func._opname) if func.namespace == "aten" else AtenOp(func._opname, None)


def is_iteration_op(func) -> bool:
    """Whether ``func`` is an op of the iteration (not C++ asking a tensor its device)."""
    return func.namespace not in QUERY_NAMESPACES


def launches_kernel(func) -> bool:
    """Whether one call of ``func`` launches a kernel on CUDA: not a view, an allocation, a question, or a range of
    the profiler."""
    if func.namespace in QUERY_NAMESPACES or func.namespace in HOST_ONLY_NAMESPACES:
        return False
    return not func.is_view and of(func).launches


def launches_kernel_by_name(name: str) -> bool:
    """:func:`launches_kernel` of an aten op known by its name only (a profiler's event): its default overload's."""
    import torch

    packet = getattr(torch.ops.aten, name, None)
    overload = getattr(packet, "default", None) if packet is not None else None
    return op(name).launches and not (overload is not None and overload.is_view)
