"""Text from files made safe: a results CSV, a ``meta.json``, a suite or a plug-in may come from anyone, and what
they say is data: never markup, never a terminal's command, never a path outside the place it is written to.

- :func:`shown`: control characters (ESC, BEL, NUL, DEL, the C1 range) and the invisible characters that reorder
  text (bidi overrides, embeddings, isolates and marks: U+202E...) or break lines (U+2028, U+2029) written as
  Python writes them in a string (``\\x1b``, ``\\u202e``), so that a terminal, a table or a pull-request comment
  shows them instead of obeying them;
- :func:`abridged`: :func:`shown`, at most so many characters of it (a legend entry of a 10 MB label);
- :func:`text`: a rich ``Text`` of :func:`shown` (a table cell: no markup, no emoji codes, no highlighting), and
  :func:`markup`, :func:`shown` escaped for rich markup (``rich.markup.escape``), where data goes inside a
  markup string;
- :func:`figure`: :func:`shown` for matplotlib, every ``$`` escaped, so that no mathtext is parsed from data
  (matplotlib draws ``\\$`` as ``$``);
- :func:`markdown`: :func:`shown` for GitHub's Markdown (a pull-request comment): HTML, entities, code spans,
  emphasis, strike-through, links, images, tables' pipes and autolinks (``http://``, ``www.``) escaped with a
  backslash, so that the comment shows the text as it is;
- :func:`argument`: :func:`shown`, quoted for a POSIX shell (``shlex.quote``): a command printed for the user to
  paste (``topk-bench run SUITE --out DIR``) runs the file it names, never a command a file name or a suite's
  value carries (``x.toml; touch PWNED; #``);
- :func:`file_name`: a name that becomes part of a file's name: kept when it follows :data:`NAME_PATTERN` (the
  rule of a suite's ``name``), else made of its safe characters, so that no file is written outside its folder.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

# A suite's name (topk_bench.suite.schema.Suite.name), and every part of a figure's file name: letters, digits,
# '_', '.', '-', starting with a letter or a digit (never '.', '..' or a hidden file), no '/'.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
# It names OUT/.<name>.meta.json.<pid>.<8 hex>.tmp and OUT/.<name>.csv.lock: they must fit a file name (255 bytes).
NAME_MAX = 200

_NAME = re.compile(NAME_PATTERN)
_UNSAFE_NAME_CHARACTER = re.compile(r"[^A-Za-z0-9_.-]+")
# C0 and C1 control characters and DEL; the Unicode controls of text direction (ALM, LRM, RLM, LRE, RLE, PDF,
# LRO, RLO, LRI, RLI, FSI, PDI) and the line and paragraph separators.
_UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
# What GitHub's Markdown reads as markup inside a line, each escaped with a backslash (the backslash too, so that
# the escapes added stay escapes).
_MARKDOWN = str.maketrans({c: "\\" + c for c in "\\`*_~[]<>&|"})
_AUTOLINK = re.compile(r"(?i)(?<=[a-z0-9])(:)(?=//)|(?<![a-z0-9])(www)(\.)")


def _escaped(match: re.Match[str]) -> str:
    return ascii(match.group())[1:-1]


def shown(value: object) -> str:
    """``value`` as text, its control and direction characters written as escapes (``\\x1b``, ``\\u202e``)."""
    text = value if isinstance(value, str) else str(value)
    return _UNSHOWN.sub(_escaped, text) if _UNSHOWN.search(text) else text


def abridged(value: object, limit: int) -> str:
    """:func:`shown`, its first ``limit`` characters and how many more there are when it is longer: a place that
    can show a line or two (a legend entry) shows that much of a label of any length."""
    text = shown(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def text(value: object, style: str = "") -> Text:
    """A rich ``Text`` of :func:`shown`: a table cell or a title that rich renders as it is (no markup, no emoji
    codes, no highlighting)."""
    from rich.text import Text

    return Text(shown(value), style=style)


def markup(value: object) -> str:
    """:func:`shown`, escaped for rich markup: ``[/]`` stays text inside a markup string. (Print the string with
    ``emoji=False``: escaping cannot stop ``:smile:`` from becoming an emoji.)"""
    from rich.markup import escape

    return escape(shown(value))


def figure(value: object) -> str:
    """:func:`shown`, every ``$`` escaped: matplotlib parses no mathtext from it and draws it as it is."""
    return shown(value).replace("$", r"\$")


def markdown(value: object) -> str:
    """:func:`shown`, escaped for GitHub's Markdown: what would be HTML, an entity, a code span, emphasis, a link, an
    image, a table's pipe or an autolink is shown as the characters it is."""
    escaped = shown(value).translate(_MARKDOWN)
    if "://" not in escaped and "www." not in escaped.lower():
        return escaped
    return _AUTOLINK.sub(lambda m: "\\:" if m.group(1) else f"{m.group(2)}\\.", escaped)


def argument(value: object) -> str:
    """:func:`shown`, quoted for a POSIX shell: one word that runs nothing when pasted (``'x.toml; rm -r ~'``); a
    plain word (``suite.toml``) stays as it is."""
    return shlex.quote(shown(value))


def is_name(value: object) -> bool:
    """Whether ``value`` may name a file as it is (:data:`NAME_PATTERN`, at most :data:`NAME_MAX` characters)."""
    return isinstance(value, str) and len(value) <= NAME_MAX and _NAME.match(value) is not None


def file_name(*parts: object) -> str:
    """``parts`` joined by '-' as a file name (its extension left out): each part that is no name (:func:`is_name`)
    made of its safe characters ('/', spaces and the like become '_', a leading '.' or '_' goes), and a name longer
    than :data:`NAME_MAX` cut, the cut part replaced by a hash of the whole, so that two names stay two."""
    safe = []
    for part in parts:
        text = str(part)
        if not is_name(text):
            text = _UNSAFE_NAME_CHARACTER.sub("_", text).lstrip("._-") or "_"
        safe.append(text)
    name = "-".join(safe)
    if len(name) <= NAME_MAX:
        return name
    digest = hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:12]
    return f"{name[: NAME_MAX - len(digest) - 1]}-{digest}"
