"""Finding and Report: the values every check produces and every renderer consumes."""
from __future__ import annotations

from ..values import value, field
TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Any

SEVERITIES = ("error", "warning", "info")
RANK = {"info": 0, "warning": 1, "error": 2}


def _absolute(target: str) -> str:
    """The checked location as an absolute path (or the URL as given)."""
    import os
    if "://" in target and not target.startswith("file://"):
        return target
    return os.path.abspath(target[len("file://"):] if target.startswith("file://") else target)


@value
class Hit:
    """What a check yields: the runner stamps rule id and final severity on it."""
    path: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    hint: str | None = None
    severity: str | None = None  # a check may grade within its rule; config overrides win


@value
class Finding:
    rule: str
    name: str
    severity: str
    path: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    hint: str | None = None
    judged: str | None = None   # the severity that decides completeness and the gate: the rule's own
                                # (or the check's grading), never a --severity override or config
    hidden: bool = False        # deselected (--select/--ignore/config): judged, but not reported
    unverified: bool = False    # its rule says "could not be verified", not "broken" (catalog `unverified`)

    @property
    def breaks(self) -> bool:
        """Does this finding make its checkpoint incomplete, whatever selection and overrides say?"""
        return (self.judged or self.severity) == "error" and not self.unverified

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "name": self.name, "severity": self.severity, "path": self.path,
                "message": self.message, "details": self.details, "hint": self.hint}


@value
class Report:
    command: str
    target: str
    findings: list[Finding] = field(default_factory=list)
    facts: Any = None          # the command's typed facts (engine/facts.py); part of JSON output
    fail_on: str = "error"
    config: str | None = None  # the config file that applied, if any
    hidden: list[Finding] = field(default_factory=list)  # judged, then hidden by selection


    def __post_init__(self):
        if self.facts is None:
            from .facts import for_command
            self.facts = for_command(self.command)

    @property
    def summary(self) -> dict[str, int]:
        out = {s: 0 for s in SEVERITIES}
        for f in self.findings:
            out[f.severity] += 1
        return out

    def failed(self, fail_on: str | None = None) -> bool:
        """The exit status: a finding at or above the threshold, or a relaunch gate that did not pass
        (`verify --target resume` judges the resume target with every rule, whatever is selected)."""
        gate = self.facts.get("gate")   # only VerifyFacts declares it; other commands' facts answer None
        if gate is not None and gate["passed"] is False:
            return True
        if (fail_on or self.fail_on) == "never":   # prune: findings are reported, its own outcome decides
            return False
        threshold = RANK[fail_on or self.fail_on]
        return any(RANK[f.severity] >= threshold for f in self.findings)

    def rules(self) -> set[str]:
        return {f.rule for f in self.findings}

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "command": self.command, "target": self.target, "root": _absolute(self.target),
                "config": self.config,
                "findings": [f.to_json() for f in self.findings], "summary": self.summary,
                "facts": self.facts.to_json()}
