"""``compile = true``: a case's attention modules through ``torch.compile``.

What is compiled is the attention each layer calls, the registry implementation's module (every layer
of the harness holds it as ``attention``; the pretrained encoder as ``attentions[i]``), not the whole
workload: the projections around it run as in the eager case, and a decode step's in-place write into
its cache stays outside the graph (compiled, a mutation of a graph input may be replayed as a copy of
the whole cache). A decoder's feed-forward layer calls an attention function too, and is compiled
alike. ``compile_mode`` is torch.compile's ``mode``.

The first call compiles (:mod:`topk_bench.measure.iterations` runs it untimed: ``compile_s``); a
compiled call runs under no dispatch mode (torch.compile skips a frame run under one), so the CPU
measures its memory from the allocator's reports and counts its ops from the profiler
(:mod:`topk_bench.measure.ops`), and it is not predicted (FakeTensorMode would run it eagerly).
"""

from __future__ import annotations

from torch import nn

# Where the layers keep their attention module (topk_bench/attention/layers.py, workloads/attention.py,
# workloads/pretrained).
ATTENTION = "attention"
ATTENTIONS = "attentions"


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The attention modules of ``model`` (outermost only), by name."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        parts = name.split(".")
        is_attention = parts[-1] == ATTENTION or (len(parts) > 1 and parts[-2] == ATTENTIONS and parts[-1].isdigit())
        if is_attention and not any(name.startswith(f"{outer}.") for outer, _ in found):
            found.append((name, module))
    return found


def compile_attention(model: nn.Module, mode: str | None = None) -> list[str]:
    """``torch.compile`` every attention module of ``model`` in place (``nn.Module.compile``); their names.
    ValueError when the model has none (a plug-in workload that names its attention otherwise)."""
    found = attention_modules(model)
    if not found:
        raise ValueError(
            "compile = true: the workload's model has no attention module to compile "
            f"(a submodule named {ATTENTION!r}, or in a list named {ATTENTIONS!r})"
        )
    for _, module in found:
        module.compile(mode=None if mode in (None, "default") else mode)
    return [name for name, _ in found]
