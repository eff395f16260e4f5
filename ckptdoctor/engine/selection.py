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
        cat = catalog()
        locked = {r.id for r in cat.values() if r.locked}
        ignored = _expand(ignore, "--ignore")
        for t in ignore:
            hit = sorted(locked & _expand([t], "--ignore"))
            if hit and t.strip().upper() != "ALL":
                raise UsageError(f"--ignore {t}: {', '.join(hit)} cannot be ignored (the run contract changes "
                                 f"only through `ckptdoctor contract new-phase`)")
        # the contract's rules stay on whatever --select / --ignore ALL say
        self.enabled = (_expand(select or ["ALL"], "--select") - ignored) | locked
        self.severity: dict[str, str] = {}
        for key, sev in severity.items():
            if sev not in ("error", "warning", "info"):
                raise UsageError(f"severity override {key}={sev!r}: use error, warning or info")
            for rid in _expand([key], "severity override"):
                if rid in locked and sev != cat[rid].severity:
                    if key.strip().upper() == "ALL":
                        continue
                    raise UsageError(f"severity override {key}={sev}: {rid} cannot be downgraded (the run "
                                     f"contract changes only through `ckptdoctor contract new-phase`)")
                self.severity[rid] = sev

    def enabled_rule(self, rule_id: str) -> bool:
        return rule_id in self.enabled
