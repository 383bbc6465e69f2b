"""Every implementation and every layer keeps all its tensors on the device it is built on.

The harness builds models under ``with torch.device(device)``; a helper that silently
draws or computes on another device (Performer's random features once came back on the
CPU) fails every case on CUDA. No GPU is needed to catch that: under
``torch.device("meta")`` a CPU round trip raises (a meta tensor has no data) and a tensor
left on the CPU cannot meet a meta one, so building and running every implementation and
layer there, and checking that every parameter, buffer, output and gradient is on meta,
catches the whole class. A :class:`~topk_bench.measure.placement.DevicePlacement` mode
around the forward and backward also names every op that mixes devices or runs off meta.
The second half does the same through the harness's own path (``workloads.build`` under
``torch.device``, then the measured ``iteration``) for every workload and implementation:
what ``measure_cuda`` does on a GPU.

(``FakeTensorMode`` with a fake CUDA device would be closer to the real thing, but on a
CPU-only build autograd aborts the process, uncatchably, when a custom
``autograd.Function`` gets a fake CUDA input: "PyTorch is not linked with support for cuda
devices".)
"""

import contextlib

import pytest
import torch

import topk_bench.attention
from topk_bench import workloads
from topk_bench.attention import Decoder, FeedForward, MultiHeadAttention
from topk_bench.case import Case
from topk_bench.measure.placement import DevicePlacement
from topk_bench.measure.steps import build, iteration
from topk_bench.workloads.support import unsupported

# Tiny tensors: a second OpenMP thread costs more than it saves (conftest.single_thread).
pytestmark = pytest.mark.usefixtures("single_thread")

# Small values for the options that exist, so that chunking and top-k really happen.
SMALL = {"chunk_size": 3, "topk": 2, "nb_features": 8}
# The project's own implementations (plug-ins that tests register are not its business).
# flex hands its tensors to torch's compiled FlexAttention, which refuses the meta device itself:
# nothing of ours places a tensor there (its own tests run it on the CPU).
SPECS = [
    s
    for s in topk_bench.attention.all_specs()
    if s.fn.__module__.startswith("topk_bench.attention.") and s.name != "flex"
]
NAMES = [s.name for s in SPECS]

META = "meta"


def small_options(spec):
    return {key: value for key, value in SMALL.items() if key in spec.options}


def assert_on(device_type, **tensors):
    wrong = {name: str(t.device) for name, t in tensors.items() if t is not None and t.device.type != device_type}
    assert not wrong, f"not on {device_type}: {wrong}"


def assert_module_on(device_type, module):
    assert_on(device_type, **dict(module.named_parameters()), **dict(module.named_buffers()))


def meta_kernels_missing(error: NotImplementedError) -> bool:
    """PyTorch itself has no meta kernel for the op (torch.sparse products): no placement bug to see."""
    return "'SparseMeta' backend" in str(error)


@contextlib.contextmanager
def placed(name, expected=None):
    """Run the block under a placement check; an op that raised reports the placement problem it made."""
    placement = DevicePlacement(expected)
    try:
        with placement:
            yield placement
    except NotImplementedError as error:
        if meta_kernels_missing(error) and not placement.problems:
            pytest.skip(f"{name}: PyTorch has no meta kernel for one of its ops")
        raise AssertionError(f"{name}: {error}; {placement.problems}") from error
    except RuntimeError as error:
        raise AssertionError(f"{name}: {error}; {placement.problems}") from error
    placement.check()


def attention_cases():
    for spec in SPECS:
        for activation in spec.activations:
            for causal in (False, True) if spec.causal else (False,):
                yield spec.name, activation, causal


@pytest.mark.parametrize("name,activation,causal", list(attention_cases()))
def test_implementation_stays_on_its_device(name, activation, causal):
    spec = topk_bench.attention.spec(name)
    with torch.device(META):
        module = spec.module(4, **small_options(spec))
        q = torch.randn(2, 3, 7, 4, requires_grad=True)
        k = torch.randn(2, 3, 8, 4, requires_grad=True)
        v = torch.randn(2, 3, 8, 4, requires_grad=True)
        with placed(name, META):
            out = module(q, k, v, causal=causal, activation=activation)
            out.mean().backward()
    assert out.shape == (2, 3, 7, 4)
    assert_module_on(META, module)
    assert_on(META, out=out, dq=q.grad, dk=k.grad, dv=v.grad)


def layers(spec):
    """(name, layer) for each layer the harness builds around ``spec``."""
    options = small_options(spec)
    # A softmax-only implementation (SDPA, Performer) cannot be a feed-forward layer: vanilla there.
    ff_name = spec.name if "relu" in spec.activations else "vanilla"
    ff_options = options if ff_name == spec.name else {}
    yield "mha", MultiHeadAttention(8, 2, spec.name, causal=spec.causal, **options)
    yield "ff", FeedForward(8, 12, ff_name, **ff_options)
    if spec.causal:
        yield (
            "decoder",
            Decoder(
                layers=2,
                d_model=8,
                heads=2,
                d_ff=12,
                attention=spec.name,
                feedforward=ff_name,
                attention_options=options,
                feedforward_options=ff_options,
            ),
        )


@pytest.mark.parametrize("name", NAMES)
def test_layers_stay_on_their_device(name):
    spec = topk_bench.attention.spec(name)
    with torch.device(META):
        built = list(layers(spec))
        for _, layer in built:
            x = torch.randn(2, 5, 8, requires_grad=True)
            with placed(name, META):
                out = layer(x)
                out.mean().backward()
            assert_on(META, out=out, dx=x.grad)
    for kind, layer in built:
        assert_module_on(META, layer)
        grads = {f"{kind}.{n}.grad": p.grad for n, p in layer.named_parameters()}
        assert all(g is not None for g in grads.values()), kind
        assert_on(META, **grads)


def test_every_registered_implementation_is_covered():
    # A new module in topk_bench/attention/ is picked up by the loop above without editing this file.
    assert {"vanilla", "qchunk", "topk", "performer"} <= set(NAMES)


def test_performer_features_are_the_packages_draws_placed_on_the_device():
    import warnings

    from topk_bench.attention.methods.performer import draw_projection

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import performer_pytorch.performer_pytorch as pp
    for rows, cols in ((8, 4), (10, 4)):  # whole QR blocks, and a partial last block
        torch.manual_seed(0)
        ours = draw_projection(rows, cols)
        torch.manual_seed(0)
        assert torch.equal(ours, pp.gaussian_orthogonal_random_matrix(rows, cols, scaling=0))
    with torch.device(META):
        assert draw_projection(8, 4).device.type == META
        assert topk_bench.attention.spec("performer").module(4, nb_features=8).projection.device.type == META


# -- the harness's path: workloads.build under torch.device, then the measured iteration ---------------

# The pretrained workload loads real weights from a file: nothing to build on meta (it is measured only).
WORKLOADS = [name for name in workloads.names() if name != "pretrained"]
TINY = {
    "mha": {"seq_len": 7, "batch": 2, "d_model": 8, "heads": 2},
    "ff": {"seq_len": 7, "batch": 2, "d_model": 8, "d_ff": 12},
    "decoder": {"seq_len": 7, "batch": 2, "d_model": 8, "heads": 2, "d_ff": 12, "layers": 2},
    "prefill": {"seq_len": 7, "batch": 2, "q_heads": 4, "kv_heads": 2, "head_dim": 8},
    "decode": {"kv_len": 7, "new_tokens": 2, "batch": 2, "q_heads": 4, "kv_heads": 2, "head_dim": 8},
}


def _mode(spec) -> str:
    """Forward and backward wherever the workload allows it (prefill does; a decode step is forward only)."""
    return spec.fixed["mode"].value if "mode" in spec.fixed else "fwd_bwd"


def workload_cases():
    for workload in WORKLOADS:
        spec = workloads.lookup(workload)
        for name in NAMES:
            causal, activation = spec.settings(None, None)
            case = Case.make(
                suite="device",
                workload=workload,
                impl=name,
                params=TINY[workload],
                options=small_options(topk_bench.attention.spec(name)),
                causal=causal,
                activation=activation,
                ff_impl=spec.default_feedforward if spec.feedforward else None,
                mode=_mode(spec),
                device=META,
            )
            if not unsupported(case, predict=False):
                yield pytest.param(case, id=f"{workload}-{name}")


def test_tiny_shapes_cover_every_workload():
    assert set(WORKLOADS) <= set(TINY), "a new workload needs a tiny shape here"
    assert {"mha", "ff", "decoder", "prefill", "decode"} <= set(WORKLOADS)


@pytest.mark.parametrize("case", list(workload_cases()))
def test_workload_builds_and_iterates_on_its_device(case):
    """What measure_cuda does, on meta: build under ``torch.device``, one forward (+ backward), nothing elsewhere.

    Building may compute on the CPU and move the result (Performer's random features): only
    mixing is an error there. In the iteration every op must run on the device.
    """
    with placed(case.impl):
        wl = build(case, META)
    with placed(case.impl, META):
        iteration(wl, case)
    assert_module_on(META, wl.model)
    assert_on(
        META,
        **{f"input{i}": x for i, x in enumerate(wl.inputs)},
        **{f"d_input{i}": x.grad for i, x in enumerate(wl.inputs)},
    )
    if case.mode == "fwd":  # a decode step: no backward, no gradients
        return
    assert all(x.grad is not None for x in wl.inputs if x.requires_grad)
    grads = {f"{n}.grad": p.grad for n, p in wl.model.named_parameters()}
    # The paper's layers have weights; prefill's attention call has none (Performer's features are a buffer).
    assert grads or case.workload == "prefill"
    assert all(g is not None for g in grads.values())
    assert_on(META, **grads)


def test_placement_names_an_op_that_mixes_devices():
    placement = DevicePlacement()
    with pytest.raises(RuntimeError), placement:
        torch.ones(3, device=META) + torch.ones(3)  # what the old Performer did: a CPU block meets the device
    assert placement.problems and "aten.add" in placement.problems[0] and "cpu, meta" in placement.problems[0]


def test_placement_expected_device_names_work_done_elsewhere_but_allows_transfers_and_scalars():
    placement = DevicePlacement(META)
    with placement:
        moved = torch.ones(3).to(META)  # factory on the CPU: noted; the transfer itself is not
        moved * torch.tensor(2.0)  # a 0-dim CPU tensor beside the device: a scalar, as CUDA allows
    assert len(placement.problems) == 1 and "runs on cpu, not on meta" in placement.problems[0]
    with pytest.raises(AssertionError, match="runs on cpu"):
        placement.check()
