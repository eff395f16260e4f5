"""--select / --ignore / severity overrides, resolved against the catalog once per run."""
from __future__ import annotations

from .catalog import Rule, catalog
from .errors import UsageError


def _matches(token: str, rule: Rule) -> bool:
    t = token.strip()
    if t.upper() == "ALL":
        return True
    return rule.id.startswith(t.upper()) or rule.name.startswith(t.lower())


def _expand(tokens: list[str], what: str) -> set[str]:
    out: set[str] = set()
    for t in tokens:
        hit = {r.id for r in catalog().values() if _matches(t, r)}
        if not hit:
            raise UsageError(f"{what}: {t!r} matches no rule (see `ckptdoctor rules`)")
        out |= hit
    return out


class Selection:
    def __init__(self, select: list[str], ignore: list[str], severity: dict[str, str]):
        self.enabled = _expand(select or ["ALL"], "--select") - _expand(ignore, "--ignore")
        self.severity: dict[str, str] = {}
        for key, sev in severity.items():
            if sev not in ("error", "warning", "info"):
                raise UsageError(f"severity override {key}={sev!r}: use error, warning or info")
            for rid in _expand([key], "severity override"):
                self.severity[rid] = sev

    def enabled_rule(self, rule_id: str) -> bool:
        return rule_id in self.enabled
