"""The chunked causal product: what a prediction replays per chunk is a few ops, with the same allocations as
the straightforward chunk loop (4-d matmuls on slices), which is kept here as the reference."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from topk_bench.attention.shared.causal_product import causal_product
from topk_bench.measure.memory import LiveBytes

pytestmark = pytest.mark.usefixtures("single_thread")


def _tril_products(x, y):
    return (x @ y.transpose(-2, -1)).tril_()


def _addmm_t_(acc, a, b):
    batch = acc.shape[:-2]
    a3 = a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b3 = b.expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    acc.view(-1, *acc.shape[-2:]).baddbmm_(a3.transpose(1, 2), b3)


class Reference(torch.autograd.Function):
    """The causal product as first written: slices and 4-d matmuls per chunk."""

    @staticmethod
    def forward(ctx, a, b, v, chunk_size):
        length = a.shape[-2]
        out = v.new_empty(*a.shape[:-1], v.shape[-1])
        state = v.new_zeros(*a.shape[:-2], a.shape[-1], v.shape[-1])
        for s in range(0, length, chunk_size):
            e = min(s + chunk_size, length)
            ac, bc, vc = a[..., s:e, :], b[..., s:e, :], v[..., s:e, :]
            out_c = ac @ state
            out_c += _tril_products(ac, bc) @ vc
            out[..., s:e, :] = out_c
            _addmm_t_(state, bc, vc)
        ctx.save_for_backward(a, b, v)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx, d_out):
        a, b, v = ctx.saved_tensors
        chunk_size = ctx.chunk_size
        length = a.shape[-2]
        starts = list(range(0, length, chunk_size))
        da, db, dv = a.new_empty(a.shape), b.new_empty(b.shape), v.new_empty(v.shape)
        state = v.new_zeros(*a.shape[:-2], v.shape[-1], b.shape[-1])
        for s in starts:
            e = min(s + chunk_size, length)
            bc, vc, doc = b[..., s:e, :], v[..., s:e, :], d_out[..., s:e, :]
            da_c = doc @ state
            da_c += _tril_products(doc, vc) @ bc
            da[..., s:e, :] = da_c
            _addmm_t_(state, vc, bc)
        state = v.new_zeros(*a.shape[:-2], a.shape[-1], v.shape[-1])
        for s in reversed(starts):
            e = min(s + chunk_size, length)
            ac, bc, vc, doc = a[..., s:e, :], b[..., s:e, :], v[..., s:e, :], d_out[..., s:e, :]
            dv_c = bc @ state
            dv_c += _tril_products(ac, bc).transpose(-2, -1) @ doc
            dv[..., s:e, :] = dv_c
            db_c = vc @ state.transpose(-2, -1)
            db_c += _tril_products(doc, vc).transpose(-2, -1) @ ac
            db[..., s:e, :] = db_c
            _addmm_t_(state, ac, doc)
        return da, db, dv, None


class Timeline(LiveBytes):
    """Every allocation in order, with the live bytes right after it (the frees since the previous
    one included, in whatever order a frame released them), and how many ops were dispatched."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.allocations: list[tuple[int, int]] = []

    def _track(self, tensor):
        before = self.current_bytes
        super()._track(tensor)
        if self.current_bytes != before:
            self.allocations.append((self.current_bytes - before, self.current_bytes))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return super().__torch_dispatch__(func, types, args, kwargs)


def predicted(fn, shape=(2, 3, 37), m=5, e=4, chunk_size=8):
    """Fake forward + backward of ``fn(a, b, v, chunk_size)``: the tracker, and the FLOPs."""
    fake = FakeTensorMode()
    with fake:
        a, b, v = (torch.randn(*shape, n, requires_grad=True) for n in (m, m, e))
    tracker = Timeline()
    tracker.register([a, b, v])
    with fake, FlopCounterMode(display=False) as flops, tracker:
        out = fn(a, b, v, chunk_size)
        out.mean().backward()
        del out
    return tracker, flops.get_total_flops()


@pytest.mark.parametrize("chunk_size", [8, 37, 5])
def test_same_allocations_in_the_same_order_as_the_straightforward_loop(chunk_size):
    new, new_flops = predicted(causal_product, chunk_size=chunk_size)
    old, old_flops = predicted(Reference.apply, chunk_size=chunk_size)
    assert new.allocations == old.allocations and new.peak_bytes == old.peak_bytes
    assert new_flops == old_flops
    if chunk_size < 37:  # several chunks: the per-chunk ops dominate
        assert new.ops < old.ops / 2


def test_same_values_and_gradients_as_the_straightforward_loop(f64):
    torch.manual_seed(0)
    a, b, v = (torch.randn(2, 3, 37, n, requires_grad=True) for n in (5, 5, 4))
    grad = torch.randn(2, 3, 37, 4)
    outs = [fn(a, b, v, 8) for fn in (causal_product, Reference.apply)]
    grads = [torch.autograd.grad(out, (a, b, v), grad) for out in outs]
    assert torch.equal(outs[0], outs[1])
    for new, old in zip(*grads):
        assert torch.equal(new, old)
