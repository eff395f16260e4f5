"""Human output: findings grouped by checkpoint, a run-root table, one summary line."""
from __future__ import annotations

import os

from rich.console import Console
from rich.table import Table
from rich.text import Text

STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def console(out) -> Console:
    return Console(file=out, highlight=False, soft_wrap=True,
                   no_color="NO_COLOR" in os.environ and os.environ["NO_COLOR"] != "")


def _size(n) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _age(s) -> str:
    if s is None:
        return "?"
    for unit, div in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= div:
            return f"{s / div:.1f}{unit}"
    return f"{s:.0f}s"


def render(report, out) -> None:
    con = console(out)
    facts = report.facts
    rows = facts.get("checkpoints") or []
    groups: dict[str, list] = {}
    names = sorted((r["name"] for r in rows), key=len, reverse=True)
    for f in report.findings:
        key = next((n for n in names if f"/{n}/" in f"{f.path}/"), "")
        groups.setdefault(key, []).append(f)
    for key in sorted(groups, key=lambda k: (k != "", k)):
        con.print(Text(key or report.target, style="bold"))
        for f in groups[key]:
            line = Text("  ")
            line.append(f"{f.severity:<7}", style=STYLE[f.severity])
            line.append(f" {f.rule} {f.name}: ", style="bold")
            line.append(f.message)
            con.print(line)
            con.print(Text(f"           {f.path}", style="dim"))
            if f.hint:
                con.print(Text(f"           hint: {f.hint}", style="dim"))
    if facts.get("kind") == "run" and rows:
        t = Table(title=f"{report.target} ({facts.get('layout')})", title_justify="left")
        for col in ("checkpoint", "step", "complete", "size", "age", "findings"):
            t.add_column(col)
        for r in rows:
            ok = "yes" if r["complete"] else "NO: " + ", ".join(r["why"][:2])
            t.add_row(r["name"], str(r["step"]), Text(ok, style="green" if r["complete"] else "red"),
                      _size(r["bytes"]), _age(r["age_seconds"]), str(r["findings"]))
        con.print(t)
    if facts.get("kind") == "run":
        rf, nc = facts.get("resume_from"), facts.get("newest_complete")
        con.print(Text(f"framework will resume from: {rf or 'nothing (starts from step 0)'}", style="bold"))
        con.print(Text(f"newest complete checkpoint: {nc or 'none'}", style="bold"))
        if rf != nc and nc:
            con.print(Text(f"hint: the framework will not load {nc}; fix the tracker/markers named above "
                           f"before relaunching", style="yellow"))
    for line in facts.get("notes") or []:
        con.print(Text(line))
    s = report.summary
    verdict = "FAIL" if report.failed() else "ok"
    con.print(Text(f"{report.command}: {verdict} - {s['error']} error(s), {s['warning']} warning(s), "
                   f"{s['info']} info", style="bold red" if report.failed() else "bold green"))
