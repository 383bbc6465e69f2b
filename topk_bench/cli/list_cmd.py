"""``topk-bench list``: the registered implementations and workloads, their options, parameters and capabilities."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from topk_bench.cli import app


@app.command("list")
def list_registry() -> None:
    """List implementations (options, legend, activations, causal support, grouped K/V heads, exactness),
    workloads (parameters) and presets (model shapes)."""
    # The registries import torch: only when the command runs, so --help stays fast.
    import implementations
    from topk_bench import workloads

    console = Console(width=200)
    table = Table(title="attention implementations")
    for column in ("name", "options (defaults)", "legend", "activations", "causal", "grouped K/V", "exact",
                   "description"):
        table.add_column(column)
    for impl in implementations.all_specs():
        options = ", ".join(f"{k}={v}" for k, v in impl.options.items()) or "-"
        # How Hkv < Hq is handled: without copies, by repeating K/V per group (memory), or not at all.
        gqa = {"native": "native", "repeats": "repeats K/V"}.get(impl.gqa or "", "unsupported")
        table.add_row(
            impl.name, options, impl.legend(), ", ".join(impl.activations),
            "yes" if impl.causal else "no", gqa, "exact" if impl.exact else "approximate", impl.description,
        )
    console.print(table)
    table = Table(title="workloads")
    for column in ("name", "parameters (defaults)", "feed-forward", "description"):
        table.add_column(column)
    for name in workloads.names():
        spec = workloads.get(name)
        params = ", ".join(f"{k}={v}" for k, v in spec.params.items()) or ("any" if spec.open_params else "-")
        table.add_row(name, params, "yes" if spec.feedforward else "no", spec.description)
    console.print(table)
    # Named values of a parameter (model = "llama-3-8b") and what each sets, once for the workloads sharing it.
    presets: dict[tuple, list[str]] = {}
    for name in workloads.names():
        for param, table_ in workloads.get(name).presets.items():
            for value, sets in table_.items():
                presets.setdefault((param, value, tuple(sets.items())), []).append(name)
    if presets:
        table = Table(title="presets")
        for column in ("parameter", "value", "sets", "workloads"):
            table.add_column(column)
        for (param, value, sets), names in presets.items():
            table.add_row(param, value, ", ".join(f"{k}={v}" for k, v in sets) or "nothing (give them)",
                          ", ".join(names))
        console.print(table)
