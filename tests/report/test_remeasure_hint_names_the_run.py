"""The warning about times measured under contention ends with the command that measures them again: the suite's
own path, the results folder, and the run's --set values (meta.json), never a placeholder where they are known."""

from __future__ import annotations

from runner_fakes import FakeRun
from topk_bench.results.columns import LOAD_END, LOAD_START

BUSY = {LOAD_START: 1.8, LOAD_END: 1.8}


class BusyRun(FakeRun):
    """Every case measured on a busy machine: its row is flagged ``busy``."""

    def __call__(self, case, budget):
        measurement = super().__call__(case, budget)
        measurement.metadata.update(BUSY)
        return measurement


def _run(cli, tmp_path, *flags):
    from faults import tiny_suite

    cli.fake = BusyRun()
    suite = tiny_suite(tmp_path, sizes=(16, 32))
    out = tmp_path / "results" / "busy"
    assert cli("run", suite, "--out", out, "-q", *flags).code == 0
    return suite, out


def test_show_plot_and_compare_name_the_suite_file_its_folder_and_its_set(cli, tmp_path):
    suite, out = _run(cli, tmp_path, "--set", "seq_len=16,32")
    command = f"topk-bench run {suite} --out {out} --set seq_len=16,32 --remeasure busy"
    shown = cli("show", out)
    assert shown.code == 0 and command in shown.err, shown.err
    drawn = cli("plot", out, "--out", tmp_path / "plots")
    assert drawn.code == 0 and command in drawn.err, drawn.err
    compared = cli("compare", out, out)
    assert "BASE: " in compared.out and command in " ".join(compared.out.split()), compared.out
    assert "SUITE" not in shown.err + drawn.err


def test_a_results_folder_that_names_no_suite_file_says_suite(cli, tmp_path):
    _, out = _run(cli, tmp_path)
    meta = out / "tiny.meta.json"
    meta.write_text(meta.read_text().replace('"suite_file"', '"suite_file_of_an_older_run"'))
    shown = cli("show", out)
    assert f"topk-bench run SUITE --out {out} --remeasure busy" in shown.err
