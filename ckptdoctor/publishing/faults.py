"""Deterministic fault injection for the crash tests (environment variables, off by default).

CKPTDOCTOR_TEST_KILL_AT=PHASE     SIGKILL this process when publish reaches PHASE
                                  (copy, manifest, rename, swap, tracker-temp, tracker, prune, upload;
                                  parts: part-record, put, elect; lock-wait: about to wait for a run
                                  root's lock, in publish, prune and verify --fix)
CKPTDOCTOR_TEST_KILL_AFTER=N      SIGKILL this process once N bytes were copied (mid-file, before the
                                  first file is placed: a moment too short to hit from outside)
CKPTDOCTOR_TEST_ENOSPC_AFTER=N    fail a write with ENOSPC once N bytes were copied (for machines
                                  where the tests cannot mount a small filesystem)
CKPTDOCTOR_TEST_PAUSE_AT=PHASE:S  sleep S seconds when publish reaches PHASE (to order two publishes)
CKPTDOCTOR_TEST_HOLD_AT=PHASE:FILE  wait at PHASE until FILE exists (at most 300 s): a test holds a
                                  window open and releases it when the other side has acted, so a race
                                  is forced, not timed (parts: copied = files placed, record not yet written)
CKPTDOCTOR_TEST_PHASE_LOG=FILE    append "PHASE MONOTONIC_SECONDS" to FILE as publish passes each phase,
                                  so a test that kills at random moments knows which phase it hit
"""
from __future__ import annotations

import errno
import os
import signal
import threading

_KILL_AT = os.environ.get("CKPTDOCTOR_TEST_KILL_AT")
_ENOSPC_AFTER = os.environ.get("CKPTDOCTOR_TEST_ENOSPC_AFTER")
_KILL_AFTER = os.environ.get("CKPTDOCTOR_TEST_KILL_AFTER")
_PHASE_LOG = os.environ.get("CKPTDOCTOR_TEST_PHASE_LOG")
_PAUSE_AT = os.environ.get("CKPTDOCTOR_TEST_PAUSE_AT")
# PHASE:FILE, split at the first colon: the file's path may hold colons of its own
_HOLD_PHASE, _, _HOLD_FILE = (os.environ.get("CKPTDOCTOR_TEST_HOLD_AT") or "").partition(":")
_written = 0
_lock = threading.Lock()


def point(phase: str) -> None:
    if _PHASE_LOG:
        import time
        fd = os.open(_PHASE_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, f"{phase} {time.monotonic():.6f}\n".encode())
        finally:
            os.close(fd)
    if _KILL_AT and _KILL_AT == phase:
        os.kill(os.getpid(), signal.SIGKILL)
    if _PAUSE_AT and _PAUSE_AT.split(":")[0] == phase:
        import time
        time.sleep(float(_PAUSE_AT.split(":")[1]))
    if _HOLD_FILE and _HOLD_PHASE == phase:
        import time
        end = time.monotonic() + 300
        while not os.path.exists(_HOLD_FILE) and time.monotonic() < end:
            time.sleep(0.02)


def wrote(n: int) -> None:
    global _written
    if _ENOSPC_AFTER is None and _KILL_AFTER is None:
        return
    with _lock:
        _written += n
        if _KILL_AFTER is not None and _written > int(_KILL_AFTER):
            os.kill(os.getpid(), signal.SIGKILL)
        if _ENOSPC_AFTER is not None and _written > int(_ENOSPC_AFTER):
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
