"""The runner: calls registered checks, applies selection and severity, collects a Report."""
from __future__ import annotations

import os
TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable

from .catalog import catalog
from .errors import TransientError
from .finding import Finding, Hit, Report
from .registry import checks_for
from .selection import Selection

_CRASH = os.environ.get("CKPTDOCTOR_TEST_CRASH")


class _NoProgress:
    def __call__(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


class Engine:
    def __init__(self, command: str, target: str, selection: Selection, fail_on: str = "error",
                 options: dict[str, Any] | None = None, debug: bool = False,
                 progress: Callable[[int, str], Any] | None = None, acknowledge: list | None = None):
        self.report = Report(command=command, target=target, fail_on=fail_on)
        self.run_root: str | None = None   # when known, replaces RUN_ROOT in the hints' commands
        self.acknowledge = acknowledge or []   # config [[acknowledge]]: shown as info, judged as ever
        self.selection = selection
        self.options = options or {}
        self.debug = debug
        self.internal_errors = 0
        self._seen: set[tuple] = set()
        self._expired_said: list = []
        self._progress = progress  # (total_bytes, label) -> a callable taking byte counts, with close()

    def progress(self, total: int, label: str):
        """A progress sink for a long step; silent unless the caller (the CLI) supplied one."""
        return self._progress(total, label) if self._progress else _NoProgress()

    def opt(self, key: str, default=None):
        v = self.options.get(key)
        return default if v is None else v

    # -- emitting -------------------------------------------------------------------------
    def emit(self, rule_id: str, hit: Hit) -> Finding | None:
        """Turn a Hit into a Finding; dedupe exact repeats (None).  A deselected rule's finding is
        made all the same and returned (completeness and the gate are judged with every rule), but
        it goes to `report.hidden`, not into the report: selection filters reporting, never judgement."""
        rule = catalog()[rule_id]
        judged = hit.severity or rule.severity
        key = (rule_id, hit.path, hit.message)
        if key in self._seen:
            return None
        self._seen.add(key)
        shown = self.selection.enabled_rule(rule_id)
        f = Finding(rule=rule_id, name=rule.name, severity=self.selection.severity.get(rule_id) or judged,
                    path=hit.path, message=hit.message, details=hit.details,
                    hint=with_command(hit.hint, rule.fix, self.run_root),   # every finding says what fixes it, and
                    judged=judged,                           # with which command (issue 41)
                    hidden=not shown, unverified=rule.unverified)
        if self.acknowledge and rule_id != "CKD903":
            self._acknowledged(f)
        (self.report.findings if shown else self.report.hidden).append(f)
        return f

    def _acknowledged(self, f: Finding) -> None:
        """A finding the config acknowledges is shown as info with the reason (its `judged` severity --
        completeness, the gate -- is untouched); an expired acknowledgement leaves it as it is and
        says so once (CKD903)."""
        import datetime
        today = datetime.date.today().isoformat()
        for a in self.acknowledge:
            if not a.matches(f.rule, f.path):
                continue
            if a.expired(today):
                if a not in self._expired_said:
                    self._expired_said.append(a)
                    self.emit("CKD903", Hit(a.source, f"the acknowledgement of {a.rule} for {a.checkpoint!r} expired "
                                                      f"on {a.until} ({a.reason}): the finding counts again",
                                            details={"rule": a.rule, "checkpoint": a.checkpoint, "until": a.until,
                                                     "reason": a.reason},
                                            hint="fix the finding, or renew the acknowledgement with a new date"))
                continue
            f.details = {**(f.details or {}), "acknowledged": {"reason": a.reason, "until": a.until, "config": a.source}}
            f.severity = "info"
            f.hint = f"acknowledged ({a.reason}" + (f", until {a.until}" if a.until else "") + ")" + \
                (f"; {f.hint}" if f.hint else "")
            return

    def run_scope(self, scope: str, subject, *args) -> list[Finding]:
        """Run every check of `scope` on `subject`; returns the findings it added (hidden ones too)."""
        added: list[Finding] = []
        for chk in checks_for(scope):   # every check runs: a deselected one's findings are judged, then hidden
            try:
                if _CRASH and _CRASH == chk.rule:  # fault injection for the exit-3 contract test
                    raise RuntimeError("injected crash (CKPTDOCTOR_TEST_CRASH)")
                hits: Iterable[Hit] = chk.fn(subject, self, *args) or ()
                for hit in hits:
                    f = self.emit(chk.rule, hit)
                    if f:
                        added.append(f)
            except TransientError:
                raise
            except Exception as exc:  # a bug in a check must not hide the other findings
                self.internal_errors += 1
                where = getattr(subject, "display", None) or str(subject)
                from .logs import logger
                logger().error("internal error in %s on %s: %s: %s", chk.rule, where, type(exc).__name__, exc)
                if self.debug:
                    import traceback
                    traceback.print_exc()
                f = self.emit("CKD900", Hit(path=where, message=f"check {chk.rule} crashed: "
                                        f"{type(exc).__name__}: {exc}", details={"rule": chk.rule},
                                        hint="this is a ckptdoctor bug; rerun with --debug and report it"))
                if f:
                    added.append(f)
        return added


def with_command(hint: str | None, fix: str | None, run_root: str | None = None) -> str | None:
    """A finding's hint: the check's own (it names the file, the step), or the rule's documented fix
    where the check gave none.  A check's hint that names no command gets the clause of the rule's
    fix that does (`ckptdoctor verify --fix RUN_ROOT` ...), so a user goes from any finding to the
    command that fixes it without the README; RUN_ROOT is the run root itself when it is known."""
    out = _with_command(hint, fix)
    if out and run_root and "RUN_ROOT" in out:
        import re
        import shlex
        out = re.sub(r"\bRUN_ROOT\b", lambda _: shlex.quote(run_root), out)
    return out


def _with_command(hint: str | None, fix: str | None) -> str | None:
    if not hint:
        return fix
    if not fix or "ckptdoctor " in hint or "`ckptdoctor " not in fix:
        return hint
    i = fix.index("`ckptdoctor ")
    ends = [e for e in (fix.find(")", i), fix.find(". ", i)) if e != -1]
    return f"{hint.rstrip('. ')} ({fix[i:min(ends) if ends else len(fix)].rstrip('. ')})"
