"""Each implementation's output and gradients against an exact reference, on the device, every op on it.

The reference is computed on the CPU in float64: vanilla for an implementation that is
(or is configured to be) exact, else the implementation itself (:mod:`.tiny`). The
candidate gets the reference's weights and inputs, runs forward and backward on the
device under :class:`~topk_bench.measure.placement.DevicePlacement`, and its output, the
input's gradient and every parameter's gradient are compared by relative error
(``|a - b| / |b|``, Frobenius norms): at most :data:`TOLERANCE` for the dtype. What this
torch cannot do (``NotImplementedError``, the harness's "unsupported") is skipped.

Covering every key makes a top-k method exact, so that check alone would pass one that keeps the wrong keys. A
method that keeps each query's ``topk`` largest scores is also judged where it drops keys (:data:`DROPPING_TOPK`
of the tiny case's keys): its attention alone, on the device, against :func:`topk_oracle`, top-k attention
computed from its definition in float64 on the CPU (output and the gradients of q, k and v).
"""

from __future__ import annotations

import contextlib

import torch

import topk_bench.attention
from topk_bench import workloads
from topk_bench.doctor import tiny
from topk_bench.doctor.check import Check, Result, brief, compile_failure
from topk_bench.extras.fidelity import rel_err
from topk_bench.measure.placement import DevicePlacement
from topk_bench.workloads.support import unsupported

# float64: roundoff of a few hundred operations; float32: room over the 5e-7 seen between a GPU and the CPU.
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}


def _run(case, device: str):
    return workloads.build(case, device, case.dtype.to_torch())


def _forward_backward(wl, placement: DevicePlacement | None = None):
    wl.clear_grads()
    if placement is None:
        out = wl()
        out.mean().backward()
    else:
        with placement:
            out = wl()
            out.mean().backward()
    # Grouped: a gradient that is zero in exact arithmetic (a key projection's bias: softmax ignores
    # a shift of every score) has a relative error of noise over noise on its own.
    return {
        "output": out.detach(),
        "input grad": _flat(x.grad for x in wl.inputs),
        "parameter grads": _flat(p.grad for p in wl.model.parameters()),
    }


def _flat(tensors) -> torch.Tensor | None:
    tensors = list(tensors)
    if any(t is None for t in tensors):
        return None
    return torch.cat([t.detach().reshape(-1).to("cpu", torch.float64) for t in tensors])


def _copy_from(dst, src) -> None:
    """``dst`` gets ``src``'s parameters, buffers (where both have them) and inputs, converted to its device and
    dtype."""
    theirs = src.model.state_dict()
    with torch.no_grad():
        for name, tensor in dst.model.state_dict().items():
            if name in theirs:
                tensor.copy_(theirs[name])
            elif name in dict(dst.model.named_parameters()):
                raise ValueError(f"the reference has no parameter {name!r}")
        for mine, reference in zip(dst.inputs, src.inputs):
            mine.copy_(reference)


def relative_error(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    if a is None or b is None:
        return 0.0 if a is None and b is None else float("inf")
    if a.shape != b.shape:
        return float("inf")
    return rel_err(a.detach().cpu(), b.detach().cpu())


# The keys a top-k method keeps where the check makes it drop keys: fewer than the tiny case's (tiny.SHAPE), not one.
DROPPING_TOPK = 3
# Each query's kept and dropped scores are at least this far apart in the dropping check's inputs (relative to the
# largest score), so that a float32 rounding on the device cannot swap the last kept key with the first dropped.
SELECTION_MARGIN = 1e-2


def topk_oracle(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, topk: int, causal: bool, scale: float = 1.0
) -> torch.Tensor:
    """Top-k attention from its definition: each query attends its ``topk`` largest scores ``scale * q kᵀ`` among
    the keys it may see (causal: the lower triangle, aligned at the last key), through a softmax over those alone.
    Independent of every implementation (plain torch ops; the caller passes float64)."""
    scores = scale * (q @ k.transpose(-2, -1))
    if causal:
        offset = k.shape[-2] - q.shape[-2]
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril(offset)
        scores = scores.masked_fill(~keep, float("-inf"))
    top = scores.topk(min(topk, k.shape[-2]), dim=-1)
    weights = top.values.softmax(dim=-1)  # a query that sees fewer keys than topk: the masked ones weigh 0
    index = top.indices.unsqueeze(-1).expand(*top.indices.shape, v.shape[-1])
    kept = v.unsqueeze(-3).expand(*q.shape[:-1], *v.shape[-2:]).gather(-2, index)
    return (weights.unsqueeze(-1) * kept).sum(dim=-2)


def _selection_margin(q: torch.Tensor, k: torch.Tensor, *, topk: int, causal: bool) -> float:
    """The smallest gap between a query's last kept and first dropped score, over the largest score."""
    scores = q @ k.transpose(-2, -1)
    if causal:
        offset = k.shape[-2] - q.shape[-2]
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(offset)
        scores = scores.masked_fill(~keep, float("-inf"))
    ordered = scores.sort(dim=-1, descending=True).values
    gaps = ordered[..., topk - 1] - ordered[..., topk]
    gaps = gaps[torch.isfinite(gaps)]  # queries that see topk keys or fewer drop none
    return float(gaps.min() / scores[torch.isfinite(scores)].abs().max()) if gaps.numel() else float("inf")


def _dropping_inputs(shape: tuple[int, ...], *, topk: int, causal: bool) -> tuple[torch.Tensor, ...]:
    """Seeded float64 q, k, v (and an output gradient) whose selection no float32 rounding changes."""
    for seed in range(100):
        generator = torch.Generator().manual_seed(seed)
        tensors = tuple(torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(4))
        if _selection_margin(tensors[0], tensors[1], topk=topk, causal=causal) > SELECTION_MARGIN:
            return tensors
    raise AssertionError("no seed below 100 gives inputs with a clear selection")


def _keeps_top_scores(impl: topk_bench.attention.Implementation) -> bool:
    """A method whose ``topk`` option is how many of each query's largest scores it keeps."""
    return "topk" in impl.options and impl.topk_of_scores


def _attention_and_grads(module, inputs, grad_out, *, causal: bool, placement: DevicePlacement | None = None):
    q, k, v = (x.detach().requires_grad_() for x in inputs)
    with placement if placement is not None else contextlib.nullcontext():
        out = module(q, k, v, causal=causal, activation="softmax")
        out.backward(grad_out)
    return {"output": out.detach(), "q, k, v grads": _flat(x.grad for x in (q, k, v))}


def dropping(name: str, device: str) -> tuple[bool, list[str]]:
    """(passed, detail parts) of ``name``'s attention where it drops keys, against :func:`topk_oracle`."""
    impl = topk_bench.attention.spec(name)
    shape = tiny.SHAPE
    head_dim = shape["d_model"] // shape["heads"]
    dims = (shape["batch"], shape["heads"], shape["seq_len"], head_dim)
    options = {**tiny.options(impl), "topk": DROPPING_TOPK}
    q, k, v, grad_out = _dropping_inputs(dims, topk=DROPPING_TOPK, causal=impl.causal)
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    # The paper's variants scale the scores inside (their scale option); every other one is passed q scaled.
    scale = {**impl.options, **options}.get("scale") or 1.0
    oracle = topk_oracle(q, k, v, topk=DROPPING_TOPK, causal=impl.causal, scale=scale)
    oracle.backward(grad_out)
    expected = {"output": oracle.detach(), "q, k, v grads": _flat(x.grad for x in (q, k, v))}
    parts, passed = [], True
    for dtype, tolerance in TOLERANCE.items():
        try:
            torch_dtype = getattr(torch, dtype)
            module = impl.module(head_dim, **options).to(device)
            inputs = [x.detach().to(device, torch_dtype) for x in (q, k, v)]
            placement = DevicePlacement(device)
            got = _attention_and_grads(
                module, inputs, grad_out.to(device, torch_dtype), causal=impl.causal, placement=placement
            )
        except NotImplementedError as exc:
            parts.append(f"{dtype}: skipped ({brief(exc, 160)})")
            continue
        except Exception as exc:  # noqa: BLE001 -- a broken implementation is a failed check, not a crash
            parts.append(f"{dtype}: raised {type(exc).__name__}: {brief(exc, 120)}")
            passed = False
            continue
        errors = {key: relative_error(got.get(key), value) for key, value in expected.items()}
        worst = max(errors, key=lambda key: errors[key])
        ok = errors[worst] <= tolerance and not placement.problems
        passed &= ok
        parts.append(f"{dtype}: max rel err {errors[worst]:.1e} ({worst}) {'<=' if ok else '>'} {tolerance:g}")
        if placement.problems:
            parts.append(f"{dtype}: {placement.problems[0]}")
    return passed, parts


def reference_of(impl: topk_bench.attention.Implementation) -> str:
    return "vanilla" if tiny.comparable_with_vanilla(impl) else impl.name


def check(name: str, device: str) -> Check:
    impl = topk_bench.attention.spec(name)
    ref_name = reference_of(impl)
    label = f"agreement: {name}"
    reference_case = tiny.case(ref_name, dtype="float64")
    problem = unsupported(tiny.case(name, device=device), predict=False)
    if problem:
        return Check(label, Result.SKIPPED, problem)
    try:
        reference = _run(reference_case, "cpu")
        expected = _forward_backward(reference)
    except NotImplementedError as exc:
        return Check(label, Result.SKIPPED, f"reference {ref_name} in float64: {exc}")
    except Exception as exc:  # noqa: BLE001 -- e.g. its package does not import here: a failed check, not a crash
        return Check(
            label, Result.FAIL, f"reference {ref_name} in float64 on cpu raised {type(exc).__name__}: {brief(exc, 120)}"
        )
    parts, passed, skipped = [], True, 0
    for dtype, tolerance in TOLERANCE.items():
        try:
            candidate = _run(tiny.case(name, device=device, dtype=dtype), device)
            _copy_from(candidate, reference)
            placement = DevicePlacement(device)
            got = _forward_backward(candidate, placement)
        except NotImplementedError as exc:
            parts.append(f"{dtype}: skipped ({brief(exc, 160)})")
            skipped += 1
            continue
        except Exception as exc:  # noqa: BLE001 -- a broken implementation is a failed check, not a crash
            refused = compile_failure(exc)
            if refused:  # what this torch cannot compile here is skipped, with its reason
                parts.append(f"{dtype}: skipped (compile failed: {refused})")
                skipped += 1
                continue
            parts.append(f"{dtype}: raised {type(exc).__name__}: {brief(exc, 120)}")
            passed = False
            continue
        errors = {key: relative_error(got.get(key), value) for key, value in expected.items()}
        worst = max(errors, key=lambda key: errors[key])
        ok = errors[worst] <= tolerance and not placement.problems
        passed &= ok
        parts.append(
            f"{dtype}: max rel err {errors[worst]:.1e} ({worst}) {'<=' if ok else '>'} {tolerance:g}"
            if errors[worst] <= tolerance or not ok and not placement.problems
            else f"{dtype}: max rel err {errors[worst]:.1e}"
        )
        if placement.problems:
            parts.append(f"{dtype}: {placement.problems[0]}")
    covering = "every key kept, " if ref_name != name and not impl.exact else ""
    detail = f"{covering}vs {ref_name} float64 on cpu; " + "; ".join(parts)
    if passed and skipped == len(TOLERANCE):
        return Check(label, Result.SKIPPED, detail)
    if _keeps_top_scores(impl):
        dropped, dropping_parts = dropping(name, device)
        passed &= dropped
        detail += (
            f"; keys dropped (topk {DROPPING_TOPK} of {tiny.SHAPE['seq_len']}), attention alone vs a float64 top-k "
            "oracle on cpu: " + "; ".join(dropping_parts)
        )
    return Check.judged(label, passed, detail)


def checks(device: str, skip: tuple[str, ...] = ()) -> list[Check]:
    """``skip``: implementations judged elsewhere (a plug-in's, in a process of its own)."""
    return [check(impl.name, device) for impl in tiny.measured() if impl.name not in skip]
