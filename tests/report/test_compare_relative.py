"""``compare --relative-to IMPL``: times judged as multiples of IMPL's at the same parameters in the same file,
round by round; a machine that got slower as a whole is no regression, one method slower is."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest

from topk_bench.cli import main
from topk_bench.errors import BadInput
from topk_bench.report import relative
from topk_bench.report.compare import compare_frames
from topk_bench.report.stats import Verdict
from topk_bench.report.thresholds import Thresholds
from topk_bench.results.columns import REQUIRED_COLUMNS

ROUNDS, REPEATS = 7, 5


def row(impl: str, seq_len: int, level: float, *, rounds=ROUNDS, drift=(), status="ok", seed=0, **options):
    """A measured row whose samples sit around ``level`` seconds, each round scaled by ``drift[r]`` (the machine's
    speed in that round, shared by every case of the round)."""
    rng = random.Random(f"{impl}{seq_len}{seed}")
    drift = drift or [1.0] * rounds
    times = [level * drift[r] * rng.uniform(0.97, 1.03) for r in range(rounds) for _ in range(REPEATS)]
    values = dict.fromkeys(REQUIRED_COLUMNS, "")
    values.update(
        suite="t", case_id=f"{impl}-{seq_len}", workload="mha", impl=impl, label=impl, mode="fwd_bwd", device="cpu",
        method="measured", status=status, peak_bytes=1000, time_median_s=sorted(times)[len(times) // 2],
        times_s=";".join(map(repr, times)) if status == "ok" else "", rounds=rounds, seq_len=seq_len,
        topk=options.get("topk", ""), **{k: v for k, v in options.items() if k != "topk"},
    )  # fmt: skip
    return values


def run(*, slower: dict[str, float] | None = None, machine: float = 1.0, seed=0, rounds=ROUNDS, **kwargs):
    """sdpa and two top-k variants at two lengths; ``slower``: an implementation's factor; ``machine``: every
    time's, with a per-round drift of ±20% (a shared runner)."""
    rng = random.Random(seed)
    drift = [machine * rng.uniform(0.8, 1.2) for _ in range(rounds)]
    slower = slower or {}
    rows = []
    for seq_len in (1024, 2048):
        base = seq_len / 1e5
        rows.append(row("sdpa", seq_len, base, drift=drift, seed=seed, rounds=rounds, **kwargs))
        for impl, share in (("topk_fast", 0.4), ("page_topk", 0.2)):
            level = base * share * slower.get(impl, 1.0)
            rows.append(row(impl, seq_len, level, drift=drift, seed=seed, rounds=rounds, topk=64, **kwargs))
    return pd.DataFrame(rows).set_index("case_id", drop=False)


def test_a_machine_slower_as_a_whole_is_no_regression_relative_to_sdpa_but_is_in_absolute_time():
    base, new = run(seed=1), run(seed=2, machine=1.4)
    assert compare_frames(base, new).has_regression  # absolute: every case ×1.4
    result = compare_frames(base, new, relative_to="sdpa")
    assert result.exit_code == 0 and not result.failures
    judged = [c for c in result.cases if c.metric("time_vs_sdpa")]
    assert len(judged) == 4 and {c.verdict for c in judged} == {Verdict.UNCHANGED}
    assert all(c.metric("time_s") is None for c in result.cases)  # the absolute time is not judged
    assert all(c.metric("time_vs_sdpa") is None for c in result.cases if c.case_id.startswith("sdpa"))


def test_one_method_1_3x_slower_is_a_regression_found_round_by_round():
    result = compare_frames(run(seed=1), run(seed=2, slower={"page_topk": 1.3}), relative_to="sdpa")
    assert result.exit_code == 1
    regressed = sorted(c.case_id for c in result.with_verdict(Verdict.REGRESSION))
    assert regressed == ["page_topk-1024", "page_topk-2048"]
    metric = result.cases[[c.case_id for c in result.cases].index("page_topk-1024")].metric("time_vs_sdpa")
    assert metric.ratio == pytest.approx(1.3, rel=0.05) and metric.p_value < 0.002
    assert metric.base == pytest.approx(0.2, rel=0.05)  # the median of the per-round ratios: 0.2x SDPA


def test_per_round_ratios_are_the_rounds_medians_divided():
    times = [1.0, 1.2, 1.1, 2.0, 2.4, 2.2]  # round 1 around 1.1, round 2 (a slower machine) around 2.2
    ref = [10.0, 10.0, 10.0, 20.0, 20.0, 20.0]
    by_round = relative.divide(times, 2, ref, 2, "ref")
    assert by_round.by_round and by_round.samples == pytest.approx([0.11, 0.11])
    per_sample = relative.divide(times, 1, ref, 1, "ref")  # no rounds: each sample over the reference's median
    assert not per_sample.by_round and per_sample.samples == pytest.approx([t / 15.0 for t in times])
    assert relative.divide(times, 2, ref, 3, "ref").by_round is False  # rounds that do not line up


def test_the_reference_is_found_at_the_same_parameters_and_sdpa_lacking_an_option_matches_every_value():
    frame = run(seed=3)
    found = relative.relative_times(frame, "sdpa", "BASE")
    assert set(found) == {"topk_fast-1024", "topk_fast-2048", "page_topk-1024", "page_topk-2048"}
    assert {found[f"topk_fast-{n}"].reference for n in (1024, 2048)} == {"sdpa-1024", "sdpa-2048"}
    assert found["topk_fast-2048"].reference == "sdpa-2048"
    # A case without a reference at its parameters is said, not judged; a failed reference too.
    lone = pd.concat([frame, pd.DataFrame([row("topk_fast", 4096, 0.01, topk=64)]).set_index("case_id", drop=False)])
    assert relative.relative_times(lone, "sdpa", "BASE")["topk_fast-4096"] == "no sdpa at its parameters"
    failed = frame.copy()
    failed.loc["sdpa-1024", "status"] = "oom"
    assert relative.relative_times(failed, "sdpa", "BASE")["page_topk-1024"] == "sdpa at its parameters is oom, untimed"


def test_an_unknown_or_ambiguous_reference_is_bad_input():
    frame = run(seed=4)
    with pytest.raises(BadInput, match=r"--relative-to: BASE has no row of 'sdpaa' to divide by \(implementations "
                                       r"there: page_topk, sdpa, topk_fast\)"):  # fmt: skip
        compare_frames(frame, frame, relative_to="sdpaa")
    twice = pd.concat([frame, pd.DataFrame([{**row("sdpa", 1024, 0.01), "case_id": "sdpa-b", "label": "SDPA b"}])])
    with pytest.raises(BadInput, match="2 rows of 'sdpa' match case topk_fast-1024 .*: name one by its label"):
        compare_frames(twice.set_index("case_id", drop=False), frame, relative_to="sdpa")
    # A label names one of them.
    labelled = twice.set_index("case_id", drop=False)
    assert relative.relative_times(labelled, "SDPA b", "BASE")["topk_fast-1024"].reference == "sdpa-b"


def test_a_reference_failed_in_new_is_invalid_and_nothing_divided_is_a_failure():
    base, new = run(seed=1), run(seed=2)
    new.loc["sdpa-1024", ["status", "times_s"]] = ["oom", ""]
    result = compare_frames(base, new, relative_to="sdpa")
    assert result.exit_code == 1
    (invalid,) = {c.case_id: c for c in result.cases}["page_topk-1024"].metrics[1:]
    assert invalid.verdict is Verdict.INVALID and invalid.note == "NEW: sdpa at its parameters is oom, untimed"
    # BASE without any reference row for its cases: said, and the gate does not pass on nothing.
    lone = base[base.impl != "page_topk"].copy()
    lone.loc[lone.impl == "sdpa", "seq_len"] = 99
    result = compare_frames(lone, lone, relative_to="sdpa")
    assert "2 case(s) of BASE without a time of sdpa to divide by" in result.warnings[0]
    assert result.failures == [
        "nothing compared relative to sdpa: no case in common has a time and a sdpa row at its parameters on both sides"
    ]


def test_the_command_line_writes_markdown_and_json_relative_to_the_reference(tmp_path, capsys):
    run(seed=1).to_csv(tmp_path / "base.csv", index=False)
    run(seed=2, slower={"topk_fast": 1.3}).to_csv(tmp_path / "new.csv", index=False)
    args = [tmp_path / "base.csv", tmp_path / "new.csv", "--relative-to", "sdpa"]
    args += ["--markdown", tmp_path / "c.md", "--json", tmp_path / "c.json"]
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", *map(str, args)])
    assert exit_info.value.code == 1
    out = capsys.readouterr().out
    assert "time / sdpa (median)" in out and "REGRESSION" in out
    markdown = (tmp_path / "c.md").read_text()
    assert "| time / sdpa (median) |" in markdown and "time over sdpa's at the same parameters" in markdown
    entries = {e["name"].rsplit(" ", 1)[1] + " " + e["extra"].split("case_id=")[1].split(";")[0]: e
               for e in json.loads((tmp_path / "c.json").read_text())}  # fmt: skip
    relative_entry = entries["time_vs_sdpa topk_fast-1024"]
    assert relative_entry["unit"] == "ratio" and relative_entry["value"] == pytest.approx(0.52, rel=0.05)
    assert "over sdpa-1024 per round; regression, ×1.3" in relative_entry["extra"]
    assert "time_vs_sdpa sdpa-1024" not in entries  # the reference has no time over itself
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", *map(str, args[:2]), "--relative-to", "nothing"])
    assert exit_info.value.code == 2
    assert "no row of 'nothing' to divide by" in capsys.readouterr().err


def test_thresholds_apply_to_the_ratios():
    base, new = run(seed=1), run(seed=2, slower={"page_topk": 1.3})
    assert compare_frames(base, new, Thresholds(time_factor=1.5), relative_to="sdpa").exit_code == 0
