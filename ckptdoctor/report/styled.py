"""The few pieces of styled output the text report is made of (a line of styled spans, a table),
and two consoles that print them: a plain one for pipes, files and Slurm logs, and rich on a
terminal or when colour is forced.

Why not rich everywhere: importing rich.console costs about 12 ms of a ~60 ms `verify` on this
project's machine (issue 20: a Slurm prolog, a shell loop over run roots, a TAB key), and
off a terminal rich prints no colour and never wraps (width 100,000), so its output there is
exactly what the plain console writes.  `tests/test_report_text.py` renders every command's
report through both and requires the same bytes."""
from __future__ import annotations

import unicodedata

# rich's Text drops these control characters (rich.control.strip_control_codes); so does the plain
# console, so a path holding one prints the same in both.
_STRIP = {7: None, 8: None, 11: None, 12: None, 13: None}


# Plain classes with __slots__, not dataclasses: building a dataclass costs ~0.5 ms at import,
# and these three exist only to be printed.
class Text:
    """A line of text made of styled spans (style: a rich style string, or None)."""
    __slots__ = ("spans",)

    def __init__(self, text: str = "", style: str | None = None):
        self.spans = [(text, style)] if text else []

    def append(self, text: str, style: str | None = None) -> "Text":
        self.spans.append((text, style))
        return self

    @property
    def plain(self) -> str:
        return "".join(t for t, _ in self.spans)


class Column:
    __slots__ = ("header", "justify")

    def __init__(self, header: str, justify: str = "left"):
        self.header, self.justify = header, justify


class Table:
    """A titled table in rich's default look (heavy head, one space of padding either side)."""
    __slots__ = ("title", "title_justify", "columns", "rows")

    def __init__(self, title: str = "", title_justify: str = "left"):
        self.title, self.title_justify = title, title_justify
        self.columns: list[Column] = []
        self.rows: list[tuple] = []      # (cells, row style)

    def add_column(self, header: str, justify: str = "left") -> None:
        self.columns.append(Column(header, justify))

    def add_row(self, *cells, style: str | None = None) -> None:
        self.rows.append((cells, style))


def _clean(s: str) -> str:
    return s.translate(_STRIP).expandtabs(8)


def cell_len(s: str) -> int:
    """Terminal columns a string takes: East Asian wide and full-width characters take two,
    combining marks none (what rich's cell_len gives for the characters paths and names use)."""
    if s.isascii():
        return len(s)
    n = 0
    for ch in s:
        if unicodedata.combining(ch):
            continue
        n += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return n


def utf8_locale(env=None) -> bool:
    """Does the locale say UTF-8?  The first of LC_ALL, LC_CTYPE, LANG that is set decides, as in
    setlocale(3); none set is the C locale.  (Python writes UTF-8 under LC_ALL=C anyway -- PEP 540 --
    but the reader of a Slurm log under that locale may not decode it.)"""
    import os
    env = os.environ if env is None else env
    if not env.get("LC_ALL") and env.get("LC_CTYPE") == "C.UTF-8" and env.get("LANG", "C") in ("C", "POSIX", ""):
        return False  # Python itself set LC_CTYPE=C.UTF-8 over a C locale at start-up (PEP 538)
    val = next((env[k] for k in ("LC_ALL", "LC_CTYPE", "LANG") if env.get(k)), "C")
    return "utf-8" in val.lower() or "utf8" in val.lower()


def plain_width(env=None) -> int:
    """Columns for prose in logs and pipes: $COLUMNS, else 100."""
    import os
    env = os.environ if env is None else env
    try:
        return max(40, int(env.get("COLUMNS", "")))
    except ValueError:
        return 100


_ASCII_BOX = str.maketrans("┏━┳┓┃┡╇┩│└─┴┘", "+=++|+++|+-++")


class PlainConsole:
    """Writes Text and Table without styles, as rich does when its output is not a terminal: prose
    wrapped at `width` columns (a word -- a path -- is never cut, so a line holding a long path may
    be wider), tables drawn in ASCII when the locale is not UTF-8."""

    def __init__(self, out, width: int | None = None, ascii_only: bool | None = None):
        self.out = out
        self.width = plain_width() if width is None else width
        self.ascii = (not utf8_locale()) if ascii_only is None else ascii_only

    def print(self, obj) -> None:
        if isinstance(obj, Table):
            lines = _table_lines(obj)
            body = lines[1:] if obj.title else lines   # the title is a path: never the reason to reflow
            if max(cell_len(x) for x in body) > self.width:  # too wide for the log: one line per row instead
                lines = ([_clean(obj.title)] if obj.title else []) + [
                    self._wrap("  " + "  ".join(" ".join(_plain(c).split()) for c in cells if _plain(c).strip()))
                    for cells, _ in obj.rows]
            text = "".join(line + "\n" for line in lines)
            self.out.write(text.translate(_ASCII_BOX) if self.ascii else text)
        else:
            self.out.write(self._wrap(_clean(obj.plain if isinstance(obj, Text) else str(obj))) + "\n")

    def _wrap(self, line: str) -> str:
        if "\n" in line or cell_len(line) <= self.width:
            return line
        import textwrap
        lead = len(line) - len(line.lstrip(" "))
        if " " not in line.strip():
            return line  # one word (a path): never cut, never moved
        hang = " " * (11 if lead == 2 else lead + 2)  # a finding's lines continue under its path and hint
        return textwrap.fill(line.lstrip(" "), self.width, initial_indent=" " * lead, subsequent_indent=hang,
                             break_long_words=False, break_on_hyphens=False, drop_whitespace=True)


def _plain(cell) -> str:
    return _clean(cell.plain if isinstance(cell, Text) else str(cell))


def _table_lines(t: Table) -> list[str]:
    heads = [_clean(c.header).split("\n") for c in t.columns]
    body = [[_plain(c).split("\n") for c in cells] for cells, _ in t.rows]
    widths = [max([cell_len(x) for x in h] + [cell_len(x) for row in body for x in row[i]])
              for i, h in enumerate(heads)]

    def rule(left: str, fill: str, mid: str, right: str) -> str:
        return left + mid.join(fill * (w + 2) for w in widths) + right

    def row_lines(cells: list[list[str]], bar: str) -> list[str]:
        out = []
        for k in range(max(len(c) for c in cells)):
            parts = []
            for i, c in enumerate(cells):
                s = c[k] if k < len(c) else ""
                pad = " " * (widths[i] - cell_len(s))
                parts.append(" " + (pad + s if t.columns[i].justify == "right" else s + pad) + " ")
            out.append(bar + bar.join(parts) + bar)
        return out

    lines = [_clean(t.title)] if t.title else []
    lines.append(rule("┏", "━", "┳", "┓"))
    lines += row_lines(heads, "┃")
    lines.append(rule("┡", "━", "╇", "┩"))
    for cells in body:
        lines += row_lines(cells, "│")
    lines.append(rule("└", "─", "┴", "┘"))
    return lines


class RichConsole:
    """rich on a terminal (its width, colours) or wherever colour is forced; every string goes in
    as rich Text, so a name holding `[...]` is printed as it is, never read as markup."""

    def __init__(self, out, width: int | None, no_color: bool, force_terminal: bool | None):
        from rich.console import Console
        self.con = Console(file=out, highlight=False, soft_wrap=True, width=width, no_color=no_color,
                           force_terminal=force_terminal)

    @staticmethod
    def _text(obj):
        from rich.text import Text as RText
        if not isinstance(obj, Text):
            return RText(str(obj))
        r = RText()
        for s, style in obj.spans:
            r.append(s, style=style)
        return r

    def print(self, obj) -> None:
        if isinstance(obj, Table):
            from rich.table import Table as RTable
            rt = RTable(title=self._text(obj.title) if obj.title else None, title_justify=obj.title_justify)
            for c in obj.columns:
                rt.add_column(self._text(c.header), justify=c.justify)
            for cells, style in obj.rows:
                rt.add_row(*(self._text(c) for c in cells), style=style)
            obj = rt
        else:
            obj = self._text(obj)
        self.con.print(obj)
