"""`--format sarif`: SARIF 2.1.0 for code-scanning uploads; rules come from the catalog."""
from __future__ import annotations

import hashlib
import json

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
        rules.append({"id": r.id, "name": r.name, "shortDescription": {"text": r.summary},
                      "fullDescription": {"text": r.why}, "help": {"text": r.fix},
                      "defaultConfiguration": {"level": LEVEL[r.severity]},
                      "properties": {"subcommands": list(r.subcommands)}})
    results = []
    for f in report.findings:
        fp = hashlib.sha256(f"{f.rule}\0{f.path}\0{f.message}".encode()).hexdigest()[:32]
        results.append({
            "ruleId": f.rule, "ruleIndex": index[f.rule], "level": LEVEL[f.severity],
            "message": {"text": f.message + (f" ({f.hint})" if f.hint else "")},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": f.path},
                                                "region": {"startLine": 1}}}],
            "partialFingerprints": {"ckptdoctor/v1": fp},
            "properties": {"details": f.details, "severity": f.severity}})
    return {"$schema": SCHEMA, "version": "2.1.0",
            "runs": [{"tool": {"driver": {"name": "ckptdoctor", "version": __version__,
                                          "informationUri": "https://example.invalid/ckptdoctor",
                                          "rules": rules}},
                      "results": results,
                      "invocations": [{"executionSuccessful": True,
                                       "commandLine": f"ckptdoctor {report.command} {report.target}"}]}]}


def render(report, out) -> None:
    json.dump(build(report), out, indent=2, default=str)
    out.write("\n")
