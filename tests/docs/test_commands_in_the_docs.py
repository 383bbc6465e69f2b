"""Every command of README.md and of the docs pages (docs/*.md) works as written.

Fast: each `topk-bench` command line of their ``bash`` blocks parses with the real command line (options
exist, values are valid) and the files it names exist (or a page says to create them); a `for` loop is
expanded over its values. The README gives a new user exactly two commands (`make demo`, `make test`) and
says once how to reach `topk-bench`. Slow: in a copy of the repository, the quick start (`make demo`, with a
stand-in for the virtual environment's `topk-bench`), then, each in a new shell that does what the README
says (`source .venv/bin/activate`), every command that is cheap enough for a test, the README's first, then
the pages' in the order of the site's nav (mkdocs.yml); the others are listed below with why they are only
parsed. The commands whose files are their own (BESIDE) run in a second lane at the same time, in their order.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import typer

from locations import ROOT

README = (ROOT / "README.md").read_text()
ACTIVATE = "source .venv/bin/activate"
# The two commands a new user types on a fresh machine: the README's quick start, and nothing else of it.
NEW_USER = ["make demo", "make test"]


def nav_pages() -> list[Path]:
    """The docs pages in the order of the site's nav (mkdocs.yml; read without a YAML parser)."""
    names = re.findall(r"^\s+- [^:\n]+: (\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    return [ROOT / "docs" / name for name in names]


PAGES = [ROOT / "README.md", *nav_pages()]

# How each command is checked, by its start: run after the quick start, only parsed (with why), or not a
# topk-bench command a test runs (with why). A command of a page that matches none fails the tests: classify it.
RUN = (
    "topk-bench show results/",
    "topk-bench plot results/",
    "topk-bench list",
    "topk-bench doctor",
    "topk-bench run first.toml",
    "cp -r results/first results/first-base",
    "topk-bench compare results/first",
    "topk-bench profile first.toml",
    "topk-bench run my_suite.toml --predict",
    "topk-bench run suites/smoke.toml",
    "topk-bench run suites/mha.toml --predict",
    "rm -rf /tmp/ci-predicted && topk-bench run suites/ci.toml --predict",
    "topk-bench compare baselines/",
    "cp /tmp/ci-predicted/ci.csv",
    "topk-bench run suites/demo_time.toml --device cpu --out results/demo --remeasure",
    "topk-bench profile suites/smoke.toml",
    "topk-bench run suites/paper/mha_cpu.toml --predict",
    "topk-bench report results/",
)
# Run commands that share no file with another (they write nothing, or only under an --out of their own outside
# results/, and read nothing another command writes): a second lane runs them beside the others, in the pages'
# order (the regression page's three, which share /tmp/ci-predicted, one after another), each as written in a
# new shell like the rest. On 2 cores each lane has a core; the measured runs' rows then say `busy`, which the
# commands that read them (compare, --remeasure) take as a user's busy machine. Any other run command goes in
# the main lane, in order: a new one is only beside when it is added here.
BESIDE = (
    "topk-bench doctor",  # both doctors: they write nothing into the copy
    "topk-bench run suites/smoke.toml --out /tmp/r",
    "rm -rf /tmp/ci-predicted && topk-bench run suites/ci.toml --predict --out /tmp/ci-predicted",
    "topk-bench compare baselines/ci-predicted.csv /tmp/ci-predicted",
    "cp /tmp/ci-predicted/ci.csv baselines/ci-predicted.csv",
    "topk-bench run suites/mha.toml --predict --set seq_len=131072 --out /tmp/mha128k",
    "topk-bench run suites/paper/mha_cpu.toml --predict --out results-cpu-pred",
)
PAPER_PREDICTED = "a figure of the paper predicted at full scale: 95 to 1016 s each on 2 cores (docs/REPRODUCTION.md)"
PARSED_ONLY = {
    "topk-bench run suites/mha.toml": "measures Fig. 1's 40 cases: about 15 min on 2 cores",
    "topk-bench run suites/kv_targets.toml": "5 rounds of 7 timed decode steps over 131072 cached tokens",
    "topk-bench run suites/decode.toml": "462 predicted cases, or 294 measured ones",
    "topk-bench run suites/sparse.toml": "30 predicted cases up to 128K tokens: NSA's and DSA's take minutes each",
    "topk-bench plot results/sparse": "draws what the sparse run above wrote",
    "topk-bench run suites/mha.toml --executor slurm": "needs a Slurm cluster (tests/run/slurm/test_slurm_cluster.py)",
    "topk-bench doctor --device cuda": "without a GPU the same checks as `topk-bench doctor`, which runs",
    "topk-bench compare BASE NEW": "the synopsis of compare, not a command",
    "topk-bench profile suites/mha.toml": "a predicted profile at 65,536 tokens: about a minute on 2 cores",
    "topk-bench profile suites/demo_memory.toml": "every implementation's predicted profile at 65,536 tokens: minutes",
    "topk-bench profile suites/paper/mha.toml": "the authors' vanilla predicted at 65,536 tokens: minutes",
    "topk-bench run suites/stages.toml": "12 measured cases to 2048 tokens, DSA's indexer loss among them: minutes",
    "topk-bench plot results/stages": "draws the run above, which is only parsed",
    "topk-bench profile suites/stages.toml": "a measured DSA profile at 1024 tokens: tens of seconds",
    "topk-bench run suites/paper/": PAPER_PREDICTED,
    "topk-bench run suites/mha.toml --predict --max-case-seconds": PAPER_PREDICTED,
    "topk-bench run suites/chunk_size.toml": PAPER_PREDICTED,
    "topk-bench run suites/ff.toml": PAPER_PREDICTED,
    "topk-bench run suites/ff_sparse.toml": PAPER_PREDICTED,
    "topk-bench run suites/decoder.toml": PAPER_PREDICTED,
    "topk-bench run suites/paper/mha_cpu.toml --device cpu": "the authors' code measured at 1K to 4K: "
    "20 min on 2 cores",
    "topk-bench plot results-pred": "draws what the predictions above wrote (`make figures` draws the committed CSVs)",
    "timeout 280 topk-bench run suites/paper/": "needs a GPU of 80 GB",
    "topk-bench plot results-cuda": "draws what the GPU run above wrote",
    "topk-bench run suites/demo_time.toml --device cpu --set": "10 cases measured on the CPU: a minute on 2 cores",
    "topk-bench run suites/demo_time.toml --device cpu --out /tmp/ab/": "15 cases of 7 timed runs each: minutes",
    "topk-bench compare /tmp/ab/base /tmp/ab/new": "compares what the two measured runs above wrote",
    "topk-bench profile suites/mha.toml --case impl=topk --set": "a predicted profile at 131,072 tokens: 10 s more",
    "topk-bench report --history": "needs the history folder a CI job keeps (docs/regression.md)",
}
NOT_RUN = {
    "make demo": "the quick start itself: run first",
    "make test": "the test suite this test is part of",
    "pip install": "installs packages",
    "git add": "a step of committing a baseline",
    "python benchmarks/": "a benchmark of the implementations: minutes of interleaved rounds (figures beside it)",
    "topk-bench gate": "the time gate: minutes of interleaved rounds (tests/gate/test_gate_runs.py)",
    "git rev-parse HEAD > baselines/time-gate-base": "a step of moving the time gate's base",
}
# The command line's parser errors (typer carries its own click): bad options, values, commands.
UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
# Flags a page names that another branch adds: a command using one is parsed without it and, in the slow test,
# skipped with the reason until the flag exists. None at the moment.
PENDING: dict[str, str] = {}


def _lines(text: str) -> list[str]:
    """The command lines of ``text``'s bash blocks, in order: continuations joined, comments cut."""
    out: list[str] = []
    for body in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in body.splitlines():
            if line.lstrip().startswith("#"):
                continue
            line = re.sub(r"\s+#\s.*$", "", line).rstrip()
            if out and (out[-1].endswith("\\") or (line.startswith(" ") and line.strip().startswith("["))):
                out[-1] = out[-1].rstrip("\\").rstrip() + " " + line.strip()
            elif line.strip():
                out.append(line.strip())
    return out


def _expand(lines: list[str]) -> list[str]:
    """``for VAR in A B; do ...; done`` (on one line, or with its body on the lines up to ``done``) as the
    commands it runs, ``$VAR`` replaced by each value."""
    out: list[str] = []
    rest = list(lines)
    while rest:
        line = rest.pop(0)
        loop = re.fullmatch(r"for (\w+) in ([^;]+); do(.*)", line)
        if not loop:
            out.append(line)
            continue
        var, values, tail = loop.group(1), loop.group(2).split(), loop.group(3).strip()
        if tail.endswith("done"):
            body = [part.strip() for part in tail[: -len("done")].split(";") if part.strip()]
        else:
            body = [tail] if tail else []
            while rest and rest[0] != "done":
                body.append(rest.pop(0))
            assert rest, f"a for loop without its done: {line!r}"
            rest.pop(0)
        for value in values:
            out += [re.sub(r"\$\{?" + var + r"\b\}?", value, command) for command in body]
    return out


def commands(text: str = README) -> list[str]:
    """The commands of a page's bash blocks, in order, loops expanded (default: the README's)."""
    return _expand(_lines(text))


def all_commands() -> list[tuple[str, str]]:
    """(page, command) for every page: the README, then the docs pages in the nav's order."""
    return [(page.name, command) for page in PAGES for command in commands(page.read_text())]


def kind(command: str) -> str:
    """run, parsed or not-run; the longest matching start decides (`run suites/mha.toml --predict` is run, the
    bare `run suites/mha.toml` parsed only)."""
    starts = [(s, "run") for s in RUN] + [(s, "parsed") for s in PARSED_ONLY] + [(s, "not-run") for s in NOT_RUN]
    matches = [(len(s), k) for s, k in starts if command.startswith(s)]
    if not matches:
        raise AssertionError(f"command not classified in tests/docs/test_commands_in_the_docs.py: {command!r}")
    return max(matches)[1]


def created_by_docs() -> dict[str, str]:
    """Files the pages give whole, to be saved under the name on their first line (``# my_attention.py``)."""
    files: dict[str, str] = {}
    for page in PAGES:
        blocks = re.findall(r"```(?:python|toml)\n(# [\w.-]+\.(?:py|toml)\n.*?)```", page.read_text(), re.S)
        for block in blocks:
            name = block.split("\n", 1)[0][2:].strip()
            assert files.get(name, block) == block, f"{page.name} gives {name} otherwise than another page"
            files[name] = block
    return files


def _topk_bench_argvs(command: str) -> list[list[str]]:
    """The arguments of each `topk-bench` call of a command line (after `timeout N` or VAR=value)."""
    argvs = []
    for part in command.split("&&"):
        words = shlex.split(part)
        while words and (re.fullmatch(r"\w+=\S*", words[0]) or words[0] == "timeout"):
            words = words[2:] if words[0] == "timeout" else words[1:]
        if words[:1] == ["topk-bench"]:
            argvs.append(words[1:])
    return argvs


def _command(name: str):
    from typer.main import get_command

    from topk_bench.cli import app

    group = get_command(app)
    return group.get_command(typer.Context(group, info_name="topk-bench"), name)


def _missing_flags(argv: list[str]) -> list[str]:
    """The pending flags this command line uses that the command line does not have yet."""
    sub = _command(argv[0]) if argv else None
    known = {opt for param in sub.params for opt in param.opts} if sub else set()
    return [flag for flag in PENDING if flag in argv and flag not in known]


def parse(argv: list[str]) -> None:
    """``topk-bench ARGV`` through the real command line's parser, nothing run; raises its UsageError."""
    sub = _command(argv[0])
    if sub is None:
        raise UsageError(f"no command {argv[0]!r}")
    sub.make_context(argv[0], list(argv[1:]))


def test_every_command_is_classified_and_the_readme_says_once_how_to_reach_topk_bench():
    found = all_commands()
    assert len(found) > 40 and ("README.md", "make demo") in found
    kinds = {c: kind(c) for _, c in found}
    assert sum(k == "run" for k in kinds.values()) >= 20
    assert README.count(ACTIVATE) == 1  # said once, in the quick start
    for page in PAGES[1:]:
        assert page.read_text().count(ACTIVATE) <= 1, page.name
    assert ACTIVATE in (ROOT / "Makefile").read_text().replace("$(VENV)", ".venv")  # and make demo says it


def test_the_readme_gives_a_new_user_exactly_two_commands():
    quick_start = re.search(r"^## Quick start\n(.*?)(?=^## )", README, re.S | re.M)
    assert quick_start, 'README.md has no section "## Quick start"'
    assert commands(quick_start.group(1)) == NEW_USER
    assert [c for c in commands() if c.startswith("make ")] == NEW_USER  # no other make command in the README
    makefile = (ROOT / "Makefile").read_text()
    for command in NEW_USER:
        assert re.search(rf"^{command.split()[1]}:", makefile, re.M), command


def test_every_topk_bench_command_of_the_pages_parses_and_names_files_that_exist():
    created = set(created_by_docs())
    assert created == {"first.toml", "my_attention.py", "my_suite.toml", "cross_attention.py"}
    for page, command in all_commands():
        if kind(command) == "not-run" or command.startswith("topk-bench compare BASE NEW"):
            continue
        argvs = _topk_bench_argvs(command)
        assert argvs or command.startswith("cp "), f"{page}: {command}: no topk-bench call"
        for argv in argvs:
            pending = _missing_flags(argv)
            if pending:  # parse the rest: the pending flag and its value left out
                at = argv.index(pending[0])
                argv = argv[:at] + argv[at + 2 :]
            parse(argv)
            for arg in argv:
                if arg.endswith((".toml", ".py")) or arg.startswith("baselines"):
                    assert (ROOT / arg).exists() or arg in created, f"{page}: {command}: {arg} does not exist"
    for wrong in (["run", "suites/mha.toml", "--predcit"], ["plot", "results/", "--format"], ["shwo", "results/"]):
        with pytest.raises(UsageError):  # the check can fail
            parse(wrong)


def test_a_for_loop_is_expanded_over_its_values():
    assert commands("```bash\nfor s in a b; do\n  topk-bench run suites/$s.toml   # x\ndone\n```\n") == [
        "topk-bench run suites/a.toml",
        "topk-bench run suites/b.toml",
    ]
    assert commands("```bash\nfor s in a b; do timeout 9 topk-bench run x/$s.toml -q; done\n```\n") == [
        "timeout 9 topk-bench run x/a.toml -q",
        "timeout 9 topk-bench run x/b.toml -q",
    ]
    assert _topk_bench_argvs("timeout 9 OMP_NUM_THREADS=1 topk-bench run x.toml") == [["run", "x.toml"]]


# --- the quick start, then the commands, each in a new shell ------------------------------------------

COPIED = (
    "topk_bench",
    "implementations",
    "suites",
    "scripts",
    "bench.toml",
    "Makefile",
    "pyproject.toml",
    "README.md",
    "docs",
    "mkdocs.yml",
    "baselines",
)


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """The repository as a new user has it after the quick start: `make demo` run, `.venv/bin/topk-bench` a
    stand-in for the installed script (this interpreter on this copy), `.venv/bin/activate` putting it on PATH."""
    root = tmp_path_factory.mktemp("clone")
    for name in COPIED:
        source, target = ROOT / name, root / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "topk-bench"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m topk_bench "$@"\n')
    script.chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    (root / ".venv" / ".installed").touch()  # newer than pyproject.toml and setup.sh: set-up is done
    for name, body in created_by_docs().items():
        (root / name).write_text(body)
    (root / "tmp").mkdir()
    done = _shell(root, "make demo", activate=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert ACTIVATE in done.stdout.splitlines()[-1]
    assert (root / "plots" / "demo" / "demo_memory-cpu-predicted.png").exists()
    return root


def _shell(root: Path, command: str, activate: bool = True) -> subprocess.CompletedProcess:
    """``command`` in a new shell at ``root`` (a login-less bash, no virtual environment on PATH); /tmp/ is
    the copy's own tmp/, so that tests in parallel do not share /tmp/ci-predicted."""
    command = command.replace("/tmp/", f"{root}/tmp/")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(root), "LANG": "C.UTF-8", "COLUMNS": "120"}
    if "SLURM_CONF" in os.environ:
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    line = f"{ACTIVATE} && {command}" if activate else command
    return subprocess.run(["bash", "-c", line], cwd=root, env=env, capture_output=True, text=True, timeout=900)


def beside(command: str) -> bool:
    """Whether ``command`` runs in the second lane (BESIDE)."""
    return command.startswith(BESIDE)


def _judge(command: str, done: subprocess.CompletedProcess) -> None:
    """A command of the pages ran as written: exit 0 (a time compare: 0 or 1), no traceback."""
    # The loop's compare judges times (its suite's repeats let it): a busy machine may make one worse, exit 1.
    judges = command.startswith("topk-bench compare results/first")
    assert done.returncode in ((0, 1) if judges else (0,)), (
        f"{command}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    )
    assert not judges or "need 7 a side" not in done.stdout, done.stdout[-2000:]
    assert "Traceback" not in done.stderr, f"{command}\n{done.stderr[-2000:]}"


def _in_order(root: Path, lane: list[str]) -> list[tuple[str, subprocess.CompletedProcess]]:
    """Each command of ``lane`` in a new shell, one after another; stops after the first that fails."""
    done = []
    for command in lane:
        done.append((command, _shell(root, command)))
        try:
            _judge(*done[-1])
        except AssertionError:
            break
    return done


def test_the_second_lanes_commands_are_run_commands_of_the_pages_and_share_no_output():
    found = {command for _, command in all_commands() if kind(command) == "run"}
    assert all(any(command.startswith(start) for command in found) for start in BESIDE), BESIDE
    lane = [command for command in dict.fromkeys(c for _, c in all_commands()) if kind(command) == "run"]
    for command in filter(beside, lane):
        argvs = _topk_bench_argvs(command)
        outs = [argv[argv.index("--out") + 1] for argv in argvs if "--out" in argv]
        # Its own folder, not one the main lane's `show results/` or `plot results/` read; or no output at all.
        assert all(not out.startswith("results/") for out in outs), command
        assert outs or all(argv[0] in ("doctor", "compare") for argv in argvs) or command.startswith("cp "), command
        for other in (c for c in lane if not beside(c)):
            assert not any(out.rstrip("/") in other for out in outs), f"{other!r} reads {command!r}'s output"


@pytest.mark.slow
def test_after_the_quick_start_every_cheap_command_of_the_pages_runs_as_written_in_a_new_shell(clone):
    lanes: dict[bool, list[str]] = {False: [], True: []}
    waiting = []
    for _, command in all_commands():
        if kind(command) != "run" or command in lanes[beside(command)]:  # a command two pages give runs once
            continue
        pending = [flag for argv in _topk_bench_argvs(command) for flag in _missing_flags(argv)]
        if pending:
            waiting.append(f"{command} (needs {', '.join(PENDING[f] for f in pending)})")
            continue
        lanes[beside(command)].append(command)
    with ThreadPoolExecutor(max_workers=1) as pool:
        second = pool.submit(_in_order, clone, lanes[True])
        first = _in_order(clone, lanes[False])
        for command, done in [*first, *second.result()]:
            _judge(command, done)
    ran = [command for command, _ in [*first, *second.result()]]
    assert len(ran) >= 20 and len(ran) == len(lanes[False]) + len(lanes[True]), ran
    # What the commands left: the README's loop drew its suite, plot results/ drew the demo's folder into
    # plots/demo/, the plug-in's suite ran.
    assert (clone / "plots" / "first" / "first-cpu-measured.png").exists()
    assert (clone / "plots" / "demo" / "demo_time-cpu-measured.png").exists()
    assert (clone / "plots" / "mine" / "my_suite-cpu-predicted.png").exists()
    if waiting:
        pytest.skip("ran every cheap command but: " + "; ".join(waiting))


@pytest.mark.slow
def test_without_the_readmes_line_a_new_shell_has_no_topk_bench_and_the_error_is_the_shells(clone):
    done = _shell(clone, "topk-bench --version", activate=False)
    assert done.returncode == 127 and "topk-bench" in done.stderr
    assert _shell(clone, "topk-bench --version").stdout.startswith("topk-bench ")


def test_the_readmes_loop_measures_the_repeats_compare_needs_to_judge_a_time(tmp_path):
    from topk_bench.report.stats import min_samples_for
    from topk_bench.report.thresholds import DEFAULT_THRESHOLDS
    from topk_bench.suite.load import load_suite

    (tmp_path / "first.toml").write_text(created_by_docs()["first.toml"])
    suite = load_suite(tmp_path / "first.toml")
    assert (suite.repeats or 0) >= min_samples_for(DEFAULT_THRESHOLDS.alpha) == 7
