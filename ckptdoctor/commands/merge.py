"""`ckptdoctor merge`: combine `verify --slice K/N --format json` reports into one verdict.

Fails closed: every slice 0..N-1 of the same target must be present exactly once.
"""
from __future__ import annotations

import json

from ..engine.catalog import catalog
from ..engine.errors import UsageError
from ..engine.finding import SEVERITIES, Finding, Report
from ..io.fs import read_regular

MAX_REPORT_BYTES = 256 << 20


def _validate(p: str, doc) -> dict:
    """The slice record of one report, every field typed; UsageError naming the file otherwise."""
    bad = UsageError(f"{p}: not a `verify --slice K/N --format json` report")
    if not isinstance(doc, dict) or doc.get("version") != 1 or not isinstance(doc.get("target"), str):
        raise bad
    facts = doc.get("facts")
    sl = facts.get("slice") if isinstance(facts, dict) else None
    if not isinstance(sl, dict) or not all(isinstance(sl.get(k), int) and not isinstance(sl.get(k), bool)
                                           for k in ("k", "n")):
        raise bad
    if not 1 <= sl["n"] <= 100_000 or not 0 <= sl["k"] < sl["n"]:
        raise UsageError(f"{p}: slice {sl['k']}/{sl['n']} is not a valid K/N (need 0 <= K < N)")
    findings = doc.get("findings")
    cat = catalog()
    if not isinstance(findings, list) or not all(
            isinstance(f, dict) and f.get("rule") in cat and f.get("severity") in SEVERITIES
            and isinstance(f.get("path"), str) and isinstance(f.get("message"), str) for f in findings):
        raise UsageError(f"{p}: its findings are not ckptdoctor findings (unknown rule or severity)")
    return sl


def read_report(p: str, limit: int = MAX_REPORT_BYTES):
    """A `--format json` report file, parsed; UsageError naming the file otherwise (shared with
    `preflight --views`)."""
    try:
        return json.loads(read_regular(p, limit))
    except OSError as exc:
        raise UsageError(f"{p}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{p}: not a JSON report ({str(exc)[:120]})") from None


def merge(paths: list[str]) -> Report:
    docs = []
    for p in paths:
        doc = read_report(p)
        docs.append((p, doc, _validate(p, doc)))
    targets = {d["target"] for _, d, _ in docs}
    ns = {sl["n"] for _, _, sl in docs}
    if len(targets) != 1 or len(ns) != 1:
        raise UsageError(f"slice reports disagree on target or N: {sorted(targets)} / {sorted(ns)}")
    n = ns.pop()
    seen: dict[int, str] = {}
    for p, _, sl in docs:
        if sl["k"] in seen:
            raise UsageError(f"slice {sl['k']}/{n} given twice ({seen[sl['k']]}, {p})")
        seen[sl["k"]] = p
    missing = sorted(set(range(n)) - set(seen))
    if missing:
        raise UsageError(f"slices {missing} of {n} are missing: coverage incomplete, no verdict")
    from ..engine.facts import MergeFacts
    rep = Report(command="verify", target=targets.pop(), facts=MergeFacts())  # a merged verify verdict
    keys = set()
    cat = catalog()
    for _, d, _ in docs:
        for f in d["findings"]:
            key = (f["rule"], f["path"], f["message"])
            if key in keys:
                continue
            keys.add(key)
            rep.findings.append(Finding(rule=f["rule"], name=f.get("name") or cat[f["rule"]].name,
                                        severity=f["severity"], path=f["path"], message=f["message"],
                                        details=f.get("details") if isinstance(f.get("details"), dict) else {},
                                        hint=f.get("hint") if isinstance(f.get("hint"), str) else None))
    def num(v):
        return v if isinstance(v, int) and not isinstance(v, bool) else 0
    rep.facts.merged_slices = n
    rep.facts.bytes_hashed = sum(num(sl.get("bytes")) for _, _, sl in docs)
    rep.facts.units_hashed = sum(num(sl.get("units")) for _, _, sl in docs)
    return rep
