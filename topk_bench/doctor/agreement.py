"""Each implementation's output and gradients against an exact reference, on the device, every op on it.

The reference is computed on the CPU in float64: vanilla for an implementation that is
(or is configured to be) exact, else the implementation itself (:mod:`.tiny`). The
candidate gets the reference's weights and inputs, runs forward and backward on the
device under :class:`~topk_bench.measure.placement.DevicePlacement`, and its output, the
input's gradient and every parameter's gradient are compared by relative error
(``|a - b| / |b|``, Frobenius norms): at most :data:`TOLERANCE` for the dtype. What this
torch cannot do (``NotImplementedError``, the harness's "unsupported") is skipped.
"""

from __future__ import annotations

import torch

import implementations
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


def reference_of(impl: implementations.Implementation) -> str:
    return "vanilla" if tiny.comparable_with_vanilla(impl) else impl.name


def check(name: str, device: str) -> Check:
    impl = implementations.spec(name)
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
    detail = f"vs {ref_name} float64 on cpu; " + "; ".join(parts)
    if passed and skipped == len(TOLERANCE):
        return Check(label, Result.SKIPPED, detail)
    return Check.judged(label, passed, detail)


def checks(device: str, skip: tuple[str, ...] = ()) -> list[Check]:
    """``skip``: implementations judged elsewhere (a plug-in's, in a process of its own)."""
    return [check(impl.name, device) for impl in tiny.measured() if impl.name not in skip]
