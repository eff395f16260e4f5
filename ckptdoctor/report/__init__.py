"""Renderers: text for humans (stdout), json and sarif for machines, one line per finding for logs
and CI (concise, github, gitlab: lines.py).  One Report in, text out."""
from __future__ import annotations

FORMATS = ("text", "json", "sarif", "concise", "github", "gitlab")


def render(report, fmt: str, out) -> None:
    if fmt == "json":
        from .json_out import render as r
    elif fmt == "sarif":
        from .sarif import render as r
    elif fmt in ("concise", "github", "gitlab"):
        from . import lines
        r = getattr(lines, fmt)
    else:
        from .text import render as r
    r(report, out)


def render_many(reports: list, fmt: str, out) -> None:
    """Several reports of one call (`verify A B ...`) as one document."""
    import json
    if fmt == "json":
        tot = {k: sum(r.summary[k] for r in reports) for k in reports[0].summary}
        json.dump({"version": 1, "command": reports[0].command, "reports": [r.to_json() for r in reports],
                   "summary": tot, "failed": [r.target for r in reports if r.failed()]},
                  out, indent=2, default=str)
        out.write("\n")
        return
    if fmt == "sarif":
        from .sarif import build
        docs = [build(r) for r in reports]
        doc = dict(docs[0])
        doc["runs"] = [run for d in docs for run in d["runs"]]
        json.dump(doc, out, indent=2, default=str, ensure_ascii=True)
        out.write("\n")
        return
    if fmt == "gitlab":
        from .lines import gitlab_issues
        json.dump([i for r in reports for i in gitlab_issues(r)], out, indent=2, ensure_ascii=False)
        out.write("\n")
        return
    for i, r in enumerate(reports):
        if i and fmt == "text":
            out.write("\n")
        render(r, fmt, out)
    failed = [r.target for r in reports if r.failed()]
    out.write(f"{reports[0].command}: {len(reports)} paths, "
              + (f"{len(failed)} failed: {', '.join(failed)}" if failed else "all ok") + "\n")
