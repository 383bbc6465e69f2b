"""The catalogue of aten ops (topk_bench/aten_ops.py) that the memory model, the time model and the op
counter read: each name an op of this torch, each op's facts the ones every reader acts on."""

from __future__ import annotations

import pytest
import torch

from topk_bench import aten_ops
from topk_bench.aten_ops import CATALOGUE, Family, KernelClass
from topk_bench.measure.ops import OpCounter
from topk_bench.predict import timing
from topk_bench.predict.kernels import registry

aten = torch.ops.aten


def test_every_catalogued_name_is_an_aten_op_of_this_torch():
    """A misspelt name would never match an op (the old hand lists named '_flash_attention_forward_backward')."""
    assert [name for name in CATALOGUE if not hasattr(aten, name)] == []


def test_the_three_readers_act_on_one_entry():
    # an outputs-only elementwise kernel: no allocation rule needed, one kernel, elementwise time
    assert registry.needs_no_rule(aten.add.Tensor) and aten_ops.launches_kernel(aten.add.Tensor)
    # an allocation: no rule needed, no kernel
    assert registry.needs_no_rule(aten.empty.memory_format) and not aten_ops.launches_kernel(aten.empty.memory_format)
    # a GEMM: a rule sizes its workspace, its blocks are its output's tiles
    assert not registry.needs_no_rule(aten.mm.default) and aten_ops.of(aten.mm.default).output_tiles
    # the profiler's ranges run on the host alone; another namespace's op is not in the catalogue
    assert registry.needs_no_rule(torch.ops.profiler._record_function_enter_new.default)
    assert not aten_ops.launches_kernel(torch.ops.profiler._record_function_enter_new.default)
    assert aten_ops.op("no_such_op") == aten_ops.AtenOp("no_such_op", None)


@pytest.mark.parametrize("family", list(Family))
def test_every_family_has_ops_and_the_time_classes_follow_the_kernels(family):
    ops = [op for op in CATALOGUE.values() if op.family == family]
    assert ops
    expected = {
        Family.GEMM: {KernelClass.GEMM},
        Family.SELECTION: {KernelClass.SELECTION},
        Family.INDEXING: {KernelClass.INDEXING},
        Family.ATTENTION: {KernelClass.ATTENTION_FWD, KernelClass.ATTENTION_BWD},
    }.get(family, {KernelClass.ELEMENTWISE})
    assert {op.kernel for op in ops} <= expected


def test_the_op_counter_and_the_time_model_count_the_same_launches():
    def body():
        x = torch.ones(8, 8)
        y = x.t().contiguous()  # a view (no kernel), then a copy (a kernel)
        torch.empty(4)  # an allocation (no kernel)
        return torch.mm(x, y).sum()

    with OpCounter() as counter:
        body()
    with timing.KernelCosts() as costs:
        body()
    assert counter.counted.launches == costs.counted.launches == len(costs.kernels)
    assert [k.kind for k in costs.kernels][-2:] == [KernelClass.GEMM, KernelClass.ELEMENTWISE]
