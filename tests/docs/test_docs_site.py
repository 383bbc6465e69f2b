"""The documentation: a short README that links every page of the site, a site that builds with
`mkdocs build --strict` (no broken link or anchor), pages that say what is true now (no issue numbers), name
modules and files that exist, and timings the Makefile and the README agree on. The commands of the pages:
tests/docs/test_commands_in_the_docs.py."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from locations import ROOT

README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))


def nav() -> list[str]:
    """The pages of mkdocs.yml's nav, in order (read without a YAML parser)."""
    return re.findall(r"^\s+- [^:\n]+: (\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)


def test_the_readme_is_short_and_links_every_page_of_the_site():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert "docs/figures/mha-cpu-predicted.png" in text  # the hero figure
    pages = nav()
    assert pages[0] == "index.md" and sorted(pages) == sorted(p.name for p in PAGES)  # every page in the nav, once
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)\)", text))
    assert linked == set(pages), set(pages) ^ linked


def test_the_docs_name_no_issue_numbers():
    for doc in (README, *PAGES):
        found = re.findall(r".{0,40}\bissue[- ]?\d+.{0,40}", doc.read_text(), re.I)
        assert not found, f"{doc.name}: {found}"


def _exists(name: str) -> bool:
    """A path (``topk_bench/child/worker.py``, ``suites/*.toml``) or a dotted name (``topk_bench.child.execute``,
    ``topk_bench.results.store.read``): the longest module it starts with exists, and what follows is a name
    that module's source has."""
    if "/" in name:
        return any(ROOT.glob(name.rstrip("/"))) if "*" in name else (ROOT / name).exists()
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:end])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if source.is_file():
            rest = parts[end:]
            return len(rest) <= 1 and all(re.search(rf"\b{re.escape(p)}\b", source.read_text()) for p in rest)
    return False


def test_every_module_and_file_the_docs_name_exists():
    pattern = re.compile(
        r"(?<![\w/.-])((?:topk_bench|implementations|scripts|benchmarks|tests|suites)"
        r"(?:[/.][\w*-]+)+/?)"
    )
    missing = []
    for doc in (README, *PAGES):
        for name in sorted(set(pattern.findall(doc.read_text()))):
            name = name.rstrip(".")
            if not _exists(name) and not (doc.parent / name).is_file():  # suites.md: a page beside this one
                missing.append(f"{doc.name}: {name}")
    assert not missing, "\n".join(missing)
    assert not _exists("topk_bench/measure/worker.py") and not _exists(
        "topk_bench.measure.worker"
    )  # the check can fail


def _quoted_lines(text: str) -> list[tuple[str, int, str]]:
    """(file, line, the code quoted for it) of every ``path.py:N`` a page quotes beside its code: a profile's
    table rows, in markdown (``| `topk_bench/attention/methods/topk.py:95` | `return ...` |``) or as printed."""
    found = [(f, int(n), code) for f, n, code in re.findall(r"\| `([\w/]+\.py):(\d+)` \| `([^`]*)`", text)]
    found += [(f, int(n), code) for f, n, code in re.findall(r"^  ([\w/]+\.py):(\d+) {2,}(\S.*?)\s{2,}", text, re.M)]
    return found


def test_every_line_of_code_a_page_quotes_is_the_line_it_names():
    """A profile quoted in a page names lines of the code; an edit that moves them makes the quote wrong, here."""
    wrong, seen = [], 0
    for doc in (README, *PAGES):
        for path, number, code in _quoted_lines(doc.read_text()):
            seen += 1
            lines = (ROOT / path).read_text().splitlines()
            actual = lines[number - 1].strip() if number <= len(lines) else ""
            quoted = code.rstrip("…").removesuffix("...")
            if not actual.startswith(quoted.strip()):
                wrong.append(f"{doc.name}: {path}:{number} is {actual!r}, the page quotes {code!r}")
    assert seen > 20, seen  # the pages quote profiles: the check reads them
    assert not wrong, "\n".join(wrong)


def test_the_makefiles_timings_are_the_readmes():
    comments = "\n".join(line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("#"))
    timings = re.findall(r"\d+ min \d+ s|(?<!min )\b\d+ s\b|about \d+ minutes", comments)
    assert len(timings) >= 4, timings
    readme = README.read_text()
    for timing in timings:
        assert timing in readme, f"the Makefile says {timing!r}, the README does not"


def test_the_site_builds_with_mkdocs_strict(tmp_path):
    """Every link and anchor between the pages resolves (mkdocs.yml turns them into warnings, --strict fails)."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed: pip install -e '.[dev]' (make docs does)")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file() and (tmp_path / "site" / "DESIGN" / "index.html").is_file()
