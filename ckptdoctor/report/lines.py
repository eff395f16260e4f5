"""One line per finding, for logs, grep and CI annotations.

  concise  `path:rule:severity: message` per finding, then the verdict line the text report ends
           with (`verify: ok - 0 errors, 0 warnings, 0 info`); for `preflight --local`, the verdict
           names the node and its ranks, so a job's first step prints one line per node
  github   GitHub Actions workflow commands: `::error file=PATH,title=RULE name::message` (warning,
           notice for the other severities), values escaped as the runner requires, then the verdict
  gitlab   GitLab code quality report: a JSON array of {description, check_name, fingerprint,
           severity, location: {path, lines: {begin}}}
"""
from __future__ import annotations

import hashlib
import json


def _one_line(s) -> str:
    return " ".join(str(s).split())


def verdict(report) -> str:
    from .text import plural
    s = report.summary
    who = report.command
    view = report.facts.get("view") if report.command == "preflight" else None
    if view:  # preflight --local: which node, which ranks
        rs = view.get("ranks") or []
        who += f" {view.get('node')}" + (f" (ranks {rs[0]}-{rs[-1]})" if len(rs) > 1 else f" (rank {rs[0]})" if rs else "")
    line = (f"{who}: {'FAIL' if report.failed() else 'ok'} - {plural(s['error'], 'error')}, "
            f"{plural(s['warning'], 'warning')}, {s['info']} info")
    rf = report.facts.get("resume_from") if report.command in ("verify", "preflight") else None
    if rf:
        line += f"; resumes from {rf}"
    chk = report.facts.get("checked") if report.command == "verify" else None
    if chk and chk.get("checkpoints"):
        from .text import _size
        line += f"; checked {plural(chk['files'], 'file')}, {_size(chk['bytes'])} ({', '.join(chk['compared'])})"
    return line


def concise(report, out) -> None:
    for f in report.findings:
        out.write(f"{f.path}:{f.rule}:{f.severity}: {_one_line(f.message)}\n")
    out.write(verdict(report) + "\n")


_GH_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def _gh_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_prop(s: str) -> str:
    return _gh_data(s).replace(":", "%3A").replace(",", "%2C")


def github(report, out) -> None:
    for f in report.findings:
        msg = f.message + (f"\nhint: {f.hint}" if f.hint else "")
        out.write(f"::{_GH_LEVEL[f.severity]} file={_gh_prop(f.path)},title={_gh_prop(f.rule + ' ' + f.name)}"
                  f"::{_gh_data(msg)}\n")
    out.write(verdict(report) + "\n")


_GL_SEVERITY = {"error": "major", "warning": "minor", "info": "info"}


def gitlab(report, out) -> None:
    json.dump(gitlab_issues(report), out, indent=2, ensure_ascii=False)
    out.write("\n")


def gitlab_issues(report) -> list[dict]:
    issues = []
    for f in report.findings:
        fp = hashlib.sha256(f"{f.rule}\0{f.path}\0{f.message}".encode("utf-8", "surrogateescape")).hexdigest()
        issues.append({"description": f"{f.rule} {f.name}: {_one_line(f.message)}", "check_name": f.rule,
                       "fingerprint": fp, "severity": _GL_SEVERITY[f.severity],
                       "location": {"path": _project_path(f.path), "lines": {"begin": 1}}})
    return issues


def _project_path(path: str) -> str:
    """GitLab's report format wants a path relative to the project directory (the job's working
    directory), without a leading ./; a path outside it (or a URL) is given as it is."""
    import os
    if "://" in path or not path:
        return path
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel == ".." or rel.startswith("../") else rel
