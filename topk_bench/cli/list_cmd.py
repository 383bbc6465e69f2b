"""``topk-bench list``: the registered implementations and workloads, their options, parameters and capabilities,
with those a suite's plug-ins (or ``--plugins``) register."""

from __future__ import annotations

from pathlib import Path

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from topk_bench.cli import Command, app, output_width
from topk_bench.untrusted import shown, text

WIDE = 160  # columns from which each implementation's legend and description are in its row


def lines(values) -> Text:
    """A cell of one value per line, each shown as text (:mod:`topk_bench.untrusted`)."""
    return Text("\n".join(shown(v) for v in values))


@app.command("list", cls=Command)
def list_registry(
    suite: Path | None = typer.Argument(
        None, metavar="SUITE", help="List this suite's implementations and workload (as it sets them) first."
    ),
    plugin_names: list[str] | None = typer.Option(
        None,
        "--plugins",
        metavar="MODULE",
        help="A module or .py file that registers implementations or workloads (repeatable).",
    ),
) -> None:
    """List implementations (options, legend, activations, causal support, grouped K/V heads, exactness),
    workloads (parameters) and presets (model shapes); with SUITE, the suite's own first."""
    # The registries import torch: only when the command runs, so --help stays fast.
    import topk_bench.attention
    from topk_bench import plugins, workloads

    spec = None
    if suite is not None:
        from topk_bench.suite.load import read_suite

        spec = read_suite(suite)
        plugins.resolve(spec.plugins, spec.path)
    if plugin_names:
        plugins.resolve(plugin_names, key="--plugins")
    width = output_width()
    console = Console(width=width)
    wide = width >= WIDE  # the legend (it repeats the options) and the description in the table: only with room
    if spec is not None:
        _suite_tables(console, spec, wide)
    specs = topk_bench.attention.all_specs()
    if spec is not None:
        console.print(
            f"every registered implementation and workload ({len(specs)} and {len(workloads.names())}):",
            highlight=False,
            markup=False,
        )
    _implementations_table(console, specs, wide)
    table = Table(title="workloads", box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
    for column in ("name", "parameters (defaults)", "feed-forward"):
        table.add_column(column, no_wrap=column == "name", overflow="fold")
    table.add_column("description", overflow="fold", ratio=1)
    for name in workloads.names():
        workload = workloads.lookup(name)
        params = ", ".join(f"{k}={v}" for k, v in workload.params.items()) or ("any" if workload.open_params else "-")
        table.add_row(text(name), text(params), "yes" if workload.feedforward else "no", text(workload.description))
    console.print(table)
    # Named values of a parameter (model = "llama-3-8b") and what each sets, once for the workloads sharing it.
    presets: dict[tuple, list[str]] = {}
    for name in workloads.names():
        for param, table_ in workloads.lookup(name).presets.items():
            for value, sets in table_.items():
                presets.setdefault((param, value, tuple(sets.items())), []).append(name)
    if presets:
        table = Table(title="presets", box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
        for column in ("parameter", "value", "sets", "workloads"):
            table.add_column(column)
        for (param, value, sets), names in presets.items():
            table.add_row(
                text(param),
                text(value),
                text(", ".join(f"{k}={v}" for k, v in sets) or "nothing (give them)"),
                text(", ".join(names)),
            )
        console.print(table)


def _implementations_table(console: Console, specs: list, wide: bool) -> None:
    table = Table(title="attention implementations", box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
    for column in (
        "name",
        "options (defaults)",
        *(["legend"] if wide else []),
        "activations",
        "causal",
        "grouped K/V",
        "exact",
    ):
        table.add_column(column, no_wrap=True)
    if wide:
        table.add_column("description", overflow="fold", ratio=1)
    for impl in specs:
        # A plug-in writes these: text, never markup (untrusted.text), one per line where several.
        options = lines(f"{k}={v}" for k, v in impl.options.items()) if impl.options else text("-")
        table.add_row(
            text(impl.name),
            options,
            *([text(impl.legend())] if wide else []),
            *_capabilities(impl),
            *([text(impl.description)] if wide else []),
        )
    console.print(table)
    if not wide:
        table = Table(title="what each implementation does", box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
        table.add_column("name", no_wrap=True)
        table.add_column("description", ratio=1)
        for impl in specs:
            table.add_row(text(impl.name), text(impl.description))
        console.print(table)


def _capabilities(impl) -> list:
    # How Hkv < Hq is handled: without copies, by repeating K/V per group (memory), or not at all.
    gqa = {"native": "native", "repeats": "repeats K/V"}.get(impl.gqa or "", "unsupported")
    return [lines(impl.activations), "yes" if impl.causal else "no", gqa, "exact" if impl.exact else "approx."]


def _suite_tables(console: Console, suite, wide: bool) -> None:
    """The suite's ``[[impl]]`` entries (their options as the suite sets them, ``*``, else the defaults) and its
    workloads' parameters (as its ``[shape]`` and ``[sweep]`` set them)."""
    import topk_bench.attention
    from topk_bench import workloads

    table = Table(
        title=f"{suite.name}: its implementations (* set by the suite)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        title_justify="left",
    )
    for column in ("entry", "name", "options", "activations", "causal", "grouped K/V", "exact"):
        table.add_column(column, no_wrap=column != "options", overflow="fold")
    for i, entry in enumerate(suite.impl):
        try:
            impl = topk_bench.attention.spec(entry.name)
        except topk_bench.attention.UnknownImplementation:
            table.add_row(f"impl[{i}]", text(entry.name), "(not registered)", "", "", "", "")
            continue
        given = {**entry.options, **{k: f"{v} (swept)" for k, v in suite.sweep.items() if k in impl.options}}
        options = [f"{k}={given[k]}*" if k in given else f"{k}={v}" for k, v in impl.options.items()]
        label = f" ({entry.label})" if entry.label else ""
        table.add_row(
            f"impl[{i}]", text(f"{entry.name}{label}"), lines(options) if options else text("-"), *_capabilities(impl)
        )
    console.print(table)
    names = list(dict.fromkeys(entry.workload or suite.workload for entry in suite.impl))
    table = Table(title=f"{suite.name}: its workload", box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
    for column in ("name", "parameters (* set by the suite)", "description"):
        table.add_column(column, overflow="fold", no_wrap=column == "name")
    for name in names:
        if name not in workloads.names():
            table.add_row(text(name), "(not registered)", "")
            continue
        workload = workloads.lookup(name)
        given = {**suite.shape, **{k: ", ".join(map(str, v)) + " (swept)" for k, v in suite.sweep.items()}}
        params = [f"{k}={given[k]}*" if k in given else f"{k}={v}" for k, v in workload.params.items()]
        params += [f"{k}={v}*" for k, v in given.items() if k not in workload.params and workload.open_params]
        table.add_row(text(name), text(", ".join(params) or "-"), text(workload.description))
    console.print(table)
