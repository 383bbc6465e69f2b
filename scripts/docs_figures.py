"""The figures of README.md and docs/ are what `topk-bench plot` draws today, from the CSVs committed beside them.

    python scripts/docs_figures.py            # redraw docs/figures/*.png from docs/figures/data/ (make figures)
    python scripts/docs_figures.py --check    # redraw into a temporary folder; exit 1 naming each figure that
                                              # differs, is missing or has no CSV (make check-figures)

Figures are compared pixel by pixel. Text is drawn by matplotlib through FreeType, whose
versions decide every glyph's pixels: ``docs/figures/data/rendered-with.json`` records the
ones that drew the committed figures, and a check under other versions says so and exits 0
without comparing (redraw with ``make figures`` to take them over).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"
DATA = FIGURES / "data"
RENDERER = DATA / "rendered-with.json"


def renderer() -> dict[str, str]:
    import matplotlib
    from matplotlib import ft2font

    return {"matplotlib": matplotlib.__version__, "freetype": ft2font.__freetype_version__}


def draw(out: Path, data: Path = DATA) -> list[Path]:
    """What `topk-bench plot DATA --out OUT` draws (``data``: a folder of CSVs with their .meta.json)."""
    from topk_bench.report.plots.figure import plot_results

    return plot_results(data, out, ("png",))


def differences(committed: Path = FIGURES, drawn: dict[str, Path] | None = None) -> list[str]:
    """One line per figure of ``committed`` that is not what `plot` draws now from docs/figures/data (empty: all
    are); ``drawn``: name -> file of figures already drawn (default: drawn now, into a temporary folder)."""
    if drawn is None:
        with tempfile.TemporaryDirectory() as tmp:
            return differences(committed, {p.name: p for p in draw(Path(tmp))})
    import numpy as np
    from matplotlib.image import imread

    problems = []
    for name in sorted(set(drawn) | {p.name for p in committed.glob("*.png")}):
        old, new = committed / name, drawn.get(name)
        if new is None:
            problems.append(f"{name}: no CSV in docs/figures/data draws it")
        elif not old.exists():
            problems.append(f"{name}: drawn from docs/figures/data but not committed")
        else:
            a, b = imread(old), imread(new)
            if a.shape != b.shape:
                problems.append(f"{name}: {a.shape[1]}x{a.shape[0]} px committed, {b.shape[1]}x{b.shape[0]} drawn")
            elif not np.array_equal(a, b):
                share = float(np.mean(np.any(a != b, axis=-1)))
                problems.append(f"{name}: {share:.2%} of its pixels differ from what plot draws now")
    return problems


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    if "--check" not in argv:
        written = draw(FIGURES)
        RENDERER.write_text(json.dumps(renderer(), indent=2) + "\n")
        print("\n".join(str(p.relative_to(ROOT)) for p in written))
        return 0
    recorded = json.loads(RENDERER.read_text())
    if recorded != renderer():
        print(
            f"docs/figures were drawn with {recorded}, this is {renderer()}: not compared "
            "(make figures redraws them with these)"
        )
        return 0
    problems = differences()
    for line in problems:
        print(f"docs/figures/{line}")
    if problems:
        print("redraw them with `make figures` (and commit them), or fix what changed them")
        return 1
    print(f"docs/figures: all {len(list(FIGURES.glob('*.png')))} figures are what plot draws from docs/figures/data")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
