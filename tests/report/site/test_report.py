"""``topk-bench report``: the site's content (hand-computed crossovers, provenance, roofline, history), its safety
with strangers' files (escaped text, links inside the folder) and its bad input (one line, exit 2, nothing
written). The page in a real browser: test_report_in_a_browser.py."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

import report_data as data
from report_data import HOSTILE, SHA, URL, crossing_rows, crossovers_csv, history_folder, report
from topk_bench.cli import main
from topk_bench.report.site import build as site_build


def test_the_crossovers_are_the_hand_computed_lengths(tmp_path, capsys):
    data.write(tmp_path / "res", crossing_rows())
    code, _, err = report(str(tmp_path / "res"), "--out", str(tmp_path / "site"), capsys=capsys)
    assert code == 0, err
    found = {r["metric"]: r for r in crossovers_csv(tmp_path / "site")}
    time, memory = found["time"], found["memory"]
    assert (time["kind"], time["baseline"], time["length"]) == ("from", "PyTorch SDPA", "seq_len")
    assert float(time["crossover"]) == pytest.approx(4000.0, rel=1e-9)
    # the samples spread +-2% around each median: at 4096 a draw can lose (0.977 x 1.02 / 0.98 > 1), so the
    # interval reaches past it, never past the next length
    assert 2048 < float(time["low"]) < 4000 < float(time["high"]) < 8192
    assert float(memory["crossover"]) == pytest.approx(3000.0, rel=1e-9)
    assert memory["low"] == "" and memory["kind"] == "from"  # a peak has no samples: no interval
    page = (tmp_path / "site" / "index.html").read_text()
    assert (
        "Top-k is faster than PyTorch SDPA from seq_len ≈ 4000 on (interpolated in log-log between 2048 and 4096"
        in page
    )
    assert "Top-k has a smaller peak than PyTorch SDPA from seq_len ≈ 3000 on" in page


def test_show_crossover_says_the_numbers_of_the_csv(tmp_path, capsys):
    data.write(tmp_path / "res", crossing_rows())
    main_code = None
    try:
        main(["show", str(tmp_path / "res"), "--crossover"])
    except SystemExit as exc:
        main_code = exc.code
    out = capsys.readouterr().out
    assert main_code in (None, 0)
    lines = [line for line in out.splitlines() if line.strip().startswith("Top-k")]
    assert re.search(r"time\s+from\s+4000\s+\d+ to \d+\s+interpolated", lines[0]), out
    assert re.search(r"memory\s+from\s+3000\s+interpolated", lines[1]), out


def test_a_baseline_and_a_length_by_option(tmp_path, capsys):
    rows = crossing_rows()
    rows += [data.row("vanilla", n, 2e-9 * n**2, 4000.0 * n, label="Vanilla") for n in (1024, 2048, 4096, 8192)]
    data.write(tmp_path / "res", rows)
    code, _, err = report(
        str(tmp_path / "res"), "--out", str(tmp_path / "site"), "--baseline", "vanilla", capsys=capsys
    )
    assert code == 0, err
    found = {(r["name"], r["metric"]): r for r in crossovers_csv(tmp_path / "site")}
    assert {r["baseline"] for r in found.values()} == {"Vanilla"}
    # SDPA against vanilla: half its time and a quarter of its peak at every length
    assert found[("PyTorch SDPA", "time")]["kind"] == "everywhere"
    # top-k against vanilla: 4e-6 L over 2e-9 L^2 is 1 at 2000
    assert float(found[("Top-k", "time")]["crossover"]) == pytest.approx(2000.0, rel=1e-9)


def test_a_baseline_that_stops_loses_from_there(tmp_path, capsys):
    rows = [r for r in crossing_rows() if not (r["impl"] == "sdpa" and r["seq_len"] == 8192)]
    rows.append(data.row("sdpa", 8192, None, None, label="PyTorch SDPA", status="oom"))
    rows = [r for r in rows if r["impl"] == "sdpa" or r["seq_len"] in (1024, 2048, 8192)]  # top-k: 4096 left out
    data.write(tmp_path / "res", rows)
    code, _, err = report(str(tmp_path / "res"), "--out", str(tmp_path / "site"), capsys=capsys)
    assert code == 0, err
    time = next(r for r in crossovers_csv(tmp_path / "site") if r["metric"] == "time")
    assert (time["kind"], float(time["crossover"])) == ("from", 8192.0)
    assert time["basis"] == "the baseline stopped at 8192: no ratio there to interpolate"


def test_the_page_says_provenance_trust_and_roofline_where_the_rows_have_them(tmp_path, capsys):
    rows = crossing_rows()
    for r in rows:
        r.update(
            trust="busy" if r["impl"] == "topk" else "",
            code_path="native_kernels=built:abc" if r["impl"] == "topk" else "",
        )
        r.update(roofline_s=r["time_median_s"] / 4, roofline_frac=0.25)
    data.write(
        tmp_path / "res", rows, meta={"suite": "s", "suite_file": "suites/s.toml", "overrides": {"seq_len": [1024]}}
    )
    code, _, err = report(str(tmp_path / "res"), "--out", str(tmp_path / "site"), capsys=capsys)
    assert code == 0, err
    page = (tmp_path / "site" / "index.html").read_text()
    assert SHA[0] not in page and "0123456789abcdef0123456789abcdef01234567" in page  # git_sha
    assert "Test CPU" in page and "Top-k: native_kernels=built:abc" in page and "suites/s.toml" in page
    assert "4 of 8 case(s) measured under contention: 4 on a busy machine" in page
    assert "Roofline fractions" in page and "25.0%" in page
    # roofline_s differs from row to row: a result, not a parameter that would make each row a series of its own
    assert [(r["name"], r["metric"]) for r in crossovers_csv(tmp_path / "site")] == [
        ("Top-k", "time"),
        ("Top-k", "memory"),
    ]
    rows_without = crossing_rows()
    data.write(tmp_path / "plain", rows_without)
    code, _, _ = report(str(tmp_path / "plain"), "--out", str(tmp_path / "site2"), capsys=capsys)
    assert code == 0 and "Roofline fractions" not in (tmp_path / "site2" / "index.html").read_text()


def test_a_cuda_prediction_names_the_gpu_part(tmp_path, capsys):
    data.write(tmp_path / "res", crossing_rows(method="predicted", device="cuda"))
    code, _, err = report(str(tmp_path / "res"), "--out", str(tmp_path / "site"), capsys=capsys)
    assert code == 0, err
    page = (tmp_path / "site" / "index.html").read_text()
    assert "GPU part (predicted)" in page and "NVIDIA H100 80GB HBM3 (h100-sxm, sm90, predicted)" in page
    assert "Top-k is predicted faster than PyTorch SDPA from seq_len ≈ 4000 on" in page


def test_text_from_the_files_is_escaped(tmp_path, capsys):
    data.write(tmp_path / "res", crossing_rows(suite="evil", label=HOSTILE), suite="evil")
    meta = {"suite": "evil", "title": HOSTILE, "suite_file": HOSTILE, "workload": "mha"}
    (tmp_path / "res" / "evil.meta.json").write_text(json.dumps(meta))
    code, _, err = report(str(tmp_path / "res"), "--out", str(tmp_path / "site"), capsys=capsys)
    assert code == 0, err
    page = (tmp_path / "site" / "index.html").read_text()
    assert "<script" not in page.lower() and "<img src=x" not in page
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;&lt;img src=x onerror=&#34;window.pwned=2&#34;&gt;" in page


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.links += [value for name, value in attrs if name in ("href", "src") and value is not None]


def test_every_link_stays_inside_the_output_folder(tmp_path, capsys):
    data.write(tmp_path / "res" / "..", crossing_rows(suite="../../outside"), suite="outside")  # a suite named ../..
    history = tmp_path / "history"
    for i in range(3):
        data.write(history / f"{i + 1:04d}-{SHA[i][:7]}", crossing_rows(git_sha=SHA[i]))
    before = set(tmp_path.parent.iterdir())
    code, _, err = report(
        str(tmp_path / "res" / ".."),
        "--out",
        str(tmp_path / "site"),
        "--history",
        str(history),
        "--commit-url",
        URL,
        capsys=capsys,
    )
    assert code == 0, err
    assert set(tmp_path.parent.iterdir()) == before  # nothing written beside the test's folder
    site = (tmp_path / "site").resolve()
    parser = _Links()
    parser.feed((site / "index.html").read_text())
    outside = [u for u in parser.links if u.startswith(("http:", "https:"))]
    assert outside and all(re.fullmatch(r"https://example\.org/repo/commit/[0-9a-f]{40}", u) for u in outside)
    for link in set(parser.links) - set(outside):
        if link.startswith("#"):
            continue
        assert ":" not in link and not link.startswith("/"), link
        target = (site / link).resolve()
        assert target.is_relative_to(site) and target.is_file(), link
    assert all(p.resolve().is_relative_to(site) for p in site.rglob("*"))


@pytest.mark.parametrize(
    "make, args, says",
    [
        (lambda p: (p / "notes.txt").write_text("hello\n"), ["notes.txt"], "not a topk-bench results file"),
        (lambda p: None, ["missing"], "no such file or directory"),
        (lambda p: (p / "nothing").mkdir(), ["nothing"], "no results CSV"),
        (lambda p: None, [], "nothing to report"),
    ],
)
def test_bad_results_are_one_line_and_no_folder(tmp_path, capsys, make, args, says):
    make(tmp_path)
    code, out, err = report(*[str(tmp_path / a) for a in args], "--out", str(tmp_path / "site"), capsys=capsys)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "site").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".site")]


def test_an_out_that_is_a_file_or_someone_elses_folder_is_left_as_it_is(tmp_path, capsys):
    data.write(tmp_path / "res", crossing_rows())
    (tmp_path / "file").write_text("mine")
    code, _, err = report(str(tmp_path / "res"), "--out", str(tmp_path / "file"), capsys=capsys)
    assert code == 2 and "--out: expected a folder for the report, got a file" in err
    assert (tmp_path / "file").read_text() == "mine"
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "thesis.tex").write_text("mine")
    code, _, err = report(str(tmp_path / "res"), "--out", str(tmp_path / "work"), capsys=capsys)
    assert code == 2 and "did not write: not replaced" in err
    assert [p.name for p in (tmp_path / "work").iterdir()] == ["thesis.tex"]


def test_a_report_replaces_an_earlier_one_and_a_failed_one_leaves_it_whole(tmp_path, capsys, monkeypatch):
    data.write(tmp_path / "res", crossing_rows())
    site = tmp_path / "site"
    assert report(str(tmp_path / "res"), "--out", str(site), capsys=capsys)[0] == 0
    first = (site / "index.html").read_text()
    (site / "stale.txt").write_text("from before")
    assert report(str(tmp_path / "res"), "--out", str(site), capsys=capsys)[0] == 0
    assert not (site / "stale.txt").exists()

    def broken(page, staging):
        (staging / "index.html").write_text("half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(site_build, "write_page", broken)
    code, _, err = report(str(tmp_path / "res"), "--out", str(site), capsys=capsys)
    assert code == 2 and "No space left on device" in err
    assert (site / "index.html").read_text()[:200] == first[:200]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res", "site"]  # no staging folder left


@pytest.mark.parametrize("url", ["javascript:alert(1)//{sha}", "https://example.org/commit/", "ftp://x/{sha}"])
def test_a_commit_url_must_be_http_with_sha(tmp_path, capsys, url):
    data.write(tmp_path / "res", crossing_rows())
    code, _, err = report(str(tmp_path / "res"), "--out", str(tmp_path / "site"), "--commit-url", url, capsys=capsys)
    assert code == 2 and "--commit-url: expected an http(s) address with {sha}" in err
    assert not (tmp_path / "site").exists()


def test_a_history_marks_the_step_the_verdict_and_links_each_point(tmp_path, capsys):
    case_id = data.row("topk", 2048, 1.0, 1.0, label="Top-k")["case_id"]
    verdict = {
        "passed": False,
        "base": SHA[2],
        "new": SHA[3],
        "cases": [{"case_id": case_id, "name": "x", "verdict": "regressed", "estimate": 1.3, "low": 1.2, "high": 1.4}],
    }
    history = history_folder(tmp_path / "history", verdict)
    (history / "0006-6666666" / "verdict.json").write_text("{not json")
    code, _, err = report(
        "--history",
        str(history),
        "--out",
        str(tmp_path / "site"),
        "--commit-url",
        URL,
        "--relative-to",
        "sdpa",
        capsys=capsys,
    )
    assert code == 0, err
    assert "0006-6666666/verdict.json: unreadable JSON" in err  # said, and the page drawn without it
    page = (tmp_path / "site" / "index.html").read_text()
    steps = re.findall(r'<li class="step">(.*?)</li>', page)
    assert len(steps) == 2 and all("time ×1.30 at" in s and SHA[3] in s and "Top-k" in s for s in steps), steps
    assert "failed against 3333333333" in page  # the gate's word on that commit
    assert 'class="step-up regressed" title="gate: regressed, ×1.3 (1.2 to 1.4)">×2.600' in page
    areas = re.findall(r'<area shape="circle" coords="(\d+),(\d+),7" href="([^"]+)"', page)
    assert {href for _, _, href in areas} == {URL.replace("{sha}", sha) for sha in SHA}
    svgs = sorted((tmp_path / "site" / "history").glob("*.svg"))
    assert len(svgs) == 4  # two cases of top-k, two of SDPA
    width = int(re.search(r'width="(\d+)" height="(\d+)" usemap', page).group(1))
    assert all(0 < int(x) < width for x, _, _ in areas)


def test_history_folders_without_numbers_are_ordered_by_their_rows_timestamps(tmp_path, capsys):
    history = history_folder(tmp_path / "history", numbered=False)  # z-, y-, x-...: the reverse of their order
    code, _, err = report("--history", str(history), "--out", str(tmp_path / "site"), capsys=capsys)
    assert code == 0, err
    page = (tmp_path / "site" / "index.html").read_text()
    header = re.search(r'<table class="history">.*?</thead>', page, re.S).group(0)
    assert [header.index(sha[:8]) for sha in SHA] == sorted(header.index(sha[:8]) for sha in SHA)
    assert "<a href=" not in header  # no --commit-url: the shas as text


def test_a_history_without_commits_is_bad_input(tmp_path, capsys):
    (tmp_path / "history" / "0001-abc").mkdir(parents=True)
    code, _, err = report("--history", str(tmp_path / "history"), "--out", str(tmp_path / "site"), capsys=capsys)
    assert code == 2 and "no commit folder with a results CSV" in err
    assert not (tmp_path / "site").exists()


def test_a_commit_folder_may_be_the_time_gates_out(tmp_path, capsys):
    history = history_folder(tmp_path / "history")
    gate = history / "0004-4444444"
    for csv_file in gate.glob("*.csv"):
        csv_file.unlink()
    # the gate's --out: this commit's blocks under NEW/ (top-k x1.2, x1.3, x1.4 over its x1.0 before), the base's
    # under BASE/ (top-k at 10x: read, it would show)
    for block, slow in ((1, 1.2), (2, 1.4), (3, 1.3)):
        rows = []
        for length in (1024, 2048):
            rows.append(data.row("sdpa", length, 1e-3, 1e6, label="PyTorch SDPA", git_sha=SHA[3]))
            rows.append(data.row("topk", length, 2e-3 * slow, 2e6, label="Top-k", git_sha=SHA[3]))
        data.write(gate / "NEW" / str(block), rows)
    data.write(gate / "BASE" / "1", [data.row("topk", 1024, 2e-2, 2e6, label="Top-k", git_sha=SHA[2])])
    code, _, err = report(
        "--history", str(history), "--out", str(tmp_path / "site"), "--relative-to", "sdpa", capsys=capsys
    )
    assert code == 0, err
    page = (tmp_path / "site" / "index.html").read_text()
    header = re.search(r'<table class="history">.*?</thead>', page, re.S).group(0)
    assert SHA[3][:8] in header  # the gate's folder is a commit, named by its rows' sha
    topk = re.search(r">[^<]*Top-k seq_len=1024</a></th>(.*?)</tr>", page).group(1)
    cells = re.findall(r">(×[0-9.]+)</td>", topk)
    assert cells == ["×2.000", "×2.000", "×2.000", "×2.600", "×2.600", "×2.600"]  # the blocks' median, x1.3
