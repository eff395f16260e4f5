"""No hangs: run a storage-bound step with a deadline and one bounded retry (issue 14).

A listing or stat on a dead NFS server or a stalled object store blocks in the kernel or the
network stack, where no Python timeout reaches it.  The step runs in a daemon thread; when it has
not answered by the deadline the process prints one line and leaves with exit 75 (requeue held:
storage unreachable, nothing judged) through os._exit, which does not wait for the stuck thread.
A transient error (ESTALE, EIO, a connection reset: TransientError) is retried once after a short
backoff when the deadline leaves room, then it is exit 75 too.
"""
from __future__ import annotations

import os
import sys
import threading
import time

from ..engine.errors import EXIT_TEMPFAIL, TransientError

BACKOFF_S = 1.0


def bounded(seconds: float | None, attempt, what: str):
    """attempt() -> result, within `seconds` (None or 0: no deadline), one retry on TransientError."""
    deadline = time.monotonic() + seconds if seconds else None
    box: dict = {}

    def body():
        for n in (1, 2):
            try:
                box["result"] = attempt()
                return
            except TransientError as exc:
                room = deadline is None or time.monotonic() + BACKOFF_S < deadline
                if n == 2 or not room:
                    box["error"] = exc
                    return
                print(f"ckptdoctor: {what}: {exc}; retrying once in {BACKOFF_S:.0f} s", file=sys.stderr)
                time.sleep(BACKOFF_S)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = exc
                return

    t = threading.Thread(target=body, name="ckd-bounded", daemon=True)
    t.start()
    t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    if t.is_alive():
        print(f"ckptdoctor: {what}: storage did not answer within {seconds:g} s (a hung mount or a stalled "
              f"object store); exit {EXIT_TEMPFAIL}: requeue and look at the storage", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_TEMPFAIL)
    if "error" in box:
        raise box["error"]
    return box["result"]
