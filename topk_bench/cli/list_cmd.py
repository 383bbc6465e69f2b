"""``topk-bench list``: the registered implementations, their options and capabilities."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from topk_bench.cli import app


@app.command("list")
def list_implementations() -> None:
    """List implementations with their options (defaults), legend, activations, causal support and exactness."""
    import implementations  # imports torch: only when the command runs, so --help stays fast

    table = Table(title="attention implementations")
    for column in ("name", "options (defaults)", "legend", "activations", "causal", "exact", "description"):
        table.add_column(column)
    for impl in implementations.all_specs():
        options = ", ".join(f"{k}={v}" for k, v in impl.options.items()) or "-"
        table.add_row(
            impl.name, options, impl.legend(), ", ".join(impl.activations),
            "yes" if impl.causal else "no", "exact" if impl.exact else "approximate", impl.description,
        )
    Console(width=200).print(table)
