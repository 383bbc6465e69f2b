"""Tables laid out as text in time linear in their cells: ``show``'s pivot tables and flat list and ``compare``'s
cases, which may have 100,000 rows (rich's tables take about a millisecond a row: minutes).

A title, a header, a rule, then the rows, one space in: each column as wide as its widest cell (in terminal
cells, so that wide characters line up), or folded at its ``max_width``, left- or right-aligned, columns two
spaces apart; a
cell may hold several lines (its row is as high as its highest cell); a row's style (a colour) on its lines
where the console shows colours. Cells are text as it is: the caller makes what a file says safe to show
(:func:`topk_bench.untrusted.shown`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.cells import cell_len
from rich.color import ColorSystem
from rich.console import Console
from rich.style import Style

from topk_bench.units import wrap

# Console.color_system's names (None: no colours, e.g. not a terminal, NO_COLOR).
_COLOUR_SYSTEMS = {
    "standard": ColorSystem.STANDARD,
    "256": ColorSystem.EIGHT_BIT,
    "truecolor": ColorSystem.TRUECOLOR,
    "windows": ColorSystem.WINDOWS,
}


# Characters that take one terminal cell each, for certain: printable ASCII, Latin-1 and the Latin extensions
# (no combining marks), general punctuation, arrows and box drawing (the tables' own ×, →, ±, ─); text of these
# only is measured by its length, where rich's cell_len looks up each character (seconds at 100,000 rows).
_NARROW = re.compile("[\x20-\x7e\u00a0-\u02ff\u2010-\u2027\u2030-\u205e\u2190-\u21ff\u2500-\u257f]*")


def _cells(text: str) -> int:
    """Terminal cells ``text`` takes."""
    return len(text) if text.isascii() or _NARROW.fullmatch(text) else cell_len(text)


class TextTable:
    def __init__(
        self,
        title: str,
        columns: Sequence[str],
        right: Sequence[bool],
        rows: Sequence[Sequence[str]],
        styles: Sequence[str] | None = None,
        max_widths: Sequence[int | None] | None = None,
    ):
        self.title, self.columns, self.right = title, list(columns), list(right)
        self.rows, self.styles = rows, styles
        self.max_widths = list(max_widths) if max_widths is not None else [None] * len(self.columns)

    @property
    def row_count(self) -> int:
        return len(self.rows)

    def _split(self, value: str, limit: int | None) -> list[str]:
        """A cell's lines: its own, each folded at ``limit`` (at spaces where it can)."""
        lines = value.split("\n")
        if limit is None or all(_cells(line) <= limit for line in lines):
            return lines
        return [part for line in lines for part in (wrap(line, limit) or [""])]

    def _lines(self) -> list[list[str]]:
        """The title's lines, the header, the rule, then each row's lines (one list per row)."""
        rows = [[self._split(v, limit) for v, limit in zip(row, self.max_widths)] for row in self.rows]
        header = [self._split(name, limit) for name, limit in zip(self.columns, self.max_widths)]
        widths = [0] * len(self.columns)
        for cells in [header, *rows]:
            for i, lines in enumerate(cells):
                widths[i] = max(widths[i], *map(_cells, lines))

        def lines_of(cells: list[list[str]]) -> list[str]:
            out = []
            for n in range(max(map(len, cells))):
                padded = []
                for lines, width, right in zip(cells, widths, self.right):
                    value = lines[n] if n < len(lines) else ""
                    width += len(value) - _cells(value)  # characters, for the terminal cells it takes
                    padded.append(value.rjust(width) if right else value.ljust(width))
                out.append((" " + "  ".join(padded)).rstrip())  # one space in, under the title, as rich's tables
            return out

        head = lines_of(header)
        rule = " " + "─" * (max(map(_cells, head)) - 1)
        return [[*self.title.split("\n"), *head, rule], *map(lines_of, rows)]

    def lines(self) -> list[str]:
        """Every line: the title, the header, its rule, then the rows'."""
        return [line for block in self._lines() for line in block]

    def print(self, console: Console) -> None:
        """Every line on ``console``'s file, each row in its style where the console has colours (a terminal):
        written at once, the rows of one style in a row as one block (compare's rows come worst first). rich's
        own rendering of 100,000 lines takes seconds; a line is never cut."""
        head, *rows = self._lines()
        colours = _COLOUR_SYSTEMS.get(console.color_system or "")
        blocks = ["\n".join(head)]
        styles = list(self.styles or [""] * len(rows))
        start = 0
        for end in range(1, len(styles) + 1):
            if end == len(styles) or styles[end] != styles[start]:
                block = "\n".join(line for lines in rows[start:end] for line in lines)
                style = styles[start]
                blocks.append(Style.parse(style).render(block, color_system=colours) if style and colours else block)
                start = end
        console.file.write("\n".join(blocks) + "\n")
