"""The "ckptdoctor" logger, with logging imported only when something is logged.

`import logging` costs ~15 ms of start-up here (it pulls traceback, string, threading), and a
normal run logs nothing.  The CLI says how it wants log lines (`configure`); the first `logger()`
call, or an fsspec storage (whose libraries log through logging), applies it."""
from __future__ import annotations

import sys

_LEVEL: str | None = None     # set by the CLI; library callers configure logging themselves
_applied = False


def configure(quiet: bool, debug: bool) -> None:
    global _LEVEL, _applied
    _LEVEL, _applied = "DEBUG" if debug else ("ERROR" if quiet else "INFO"), False
    if "logging" in sys.modules:   # already imported by something else: apply now, as before
        apply()


def apply() -> None:
    global _applied
    if _LEVEL is None or _applied:
        return
    import logging
    logging.basicConfig(level=getattr(logging, _LEVEL), format="ckptdoctor: %(message)s", stream=sys.stderr)
    _applied = True


def logger(name: str = "ckptdoctor"):
    apply()
    import logging
    return logging.getLogger(name)
