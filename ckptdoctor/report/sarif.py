"""`--format sarif`: SARIF 2.1.0 for code-scanning uploads; rules come from the catalog."""
from __future__ import annotations

import hashlib
import json
import os
from urllib.parse import quote

from .. import __version__
from ..engine.catalog import catalog

LEVEL = {"error": "error", "warning": "warning", "info": "note"}
SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def build(report) -> dict:
    cat = catalog()
    used = sorted({f.rule for f in report.findings})
    rules = []
    index = {}
    for i, rid in enumerate(used):
        r = cat[rid]
        index[rid] = i
        md = f"**{r.summary}**\n\n**Why it matters.** {r.why}\n\n**How to fix.** {r.fix}"
        if r.example:
            md += f"\n\n**Example.**\n\n```\n{r.example}\n```"
        rules.append({"id": r.id, "name": r.name, "shortDescription": {"text": r.summary},
                      "fullDescription": {"text": r.why}, "help": {"text": r.fix, "markdown": md},
                      "defaultConfiguration": {"level": LEVEL[r.severity]},
                      "properties": {"subcommands": list(r.subcommands)}})
    root = _root(report.target)
    results = []
    for f in report.findings:
        fp = hashlib.sha256(f"{f.rule}\0{f.path}\0{f.message}".encode("utf-8", "surrogateescape")).hexdigest()[:32]
        loc: dict = {"artifactLocation": _artifact(f.path, root)}
        if "://" not in f.path and os.path.isfile(f.path):  # a line only for a file, never a directory
            loc["region"] = {"startLine": 1}
        results.append({
            "ruleId": f.rule, "ruleIndex": index[f.rule], "level": LEVEL[f.severity],
            "message": {"text": f.message + (f" ({f.hint})" if f.hint else "")},
            "locations": [{"physicalLocation": loc}],
            "partialFingerprints": {"ckptdoctor/v1": fp},
            "properties": {"details": f.details, "severity": f.severity}})
    run = {"tool": {"driver": {"name": "ckptdoctor", "version": __version__, "rules": rules}}}
    if root:
        run["originalUriBaseIds"] = {"CHECKPOINT": {"uri": root, "description": {"text": "the location checked"}}}
    return {"$schema": SCHEMA, "version": "2.1.0",
            "runs": [{**run,
                      "results": results,
                      "invocations": [{"executionSuccessful": True,
                                       "commandLine": f"ckptdoctor {report.command} {report.target}",
                                       **_summary(report)}]}]}


def _summary(report) -> dict:
    """The positive summary (what was checked, the verdict) as the invocation's property bag and a
    notification a viewer shows even when there are no results."""
    checked = report.facts.get("checked")
    verdict = "FAIL" if report.failed() else "ok"
    props = {"verdict": verdict, **({"checked": checked} if checked else {})}
    if checked and checked.get("checkpoints"):
        text = (f"{report.command}: {verdict}; checked {checked['checkpoints']} checkpoint(s), {checked['files']} "
                f"file(s), {checked['bytes']} bytes ({', '.join(checked['compared'])})")
    else:
        text = f"{report.command}: {verdict}"
    return {"properties": props, "toolExecutionNotifications": [{"level": "note", "message": {"text": text}}]}


def _root(target: str) -> str | None:
    """The checked location as a URI ending in '/', the base of every artifact below it."""
    if "://" in target and not target.startswith("file://"):
        return target.rstrip("/") + "/"
    p = os.path.abspath(target[len("file://"):] if target.startswith("file://") else target)
    if os.path.isfile(p):
        p = os.path.dirname(p)
    return "file://" + quote(p.rstrip("/") + "/", errors="surrogateescape")


def _artifact(path: str, root: str | None) -> dict:
    """Relative to CHECKPOINT when below it; otherwise an absolute file:// (or store) URI."""
    uri = path if "://" in path else "file://" + quote(os.path.abspath(path), errors="surrogateescape")
    if root and (uri + "/").startswith(root):
        rel = uri[len(root):]
        return {"uri": rel or ".", "uriBaseId": "CHECKPOINT"}
    return {"uri": uri}


def render(report, out) -> None:
    # ASCII with \u escapes, as --format json writes: a path that is not UTF-8 (its bytes kept as lone
    # surrogates) is an escape in the document, never an encoding error on the way out
    json.dump(build(report), out, indent=2, default=str, ensure_ascii=True)
    out.write("\n")
