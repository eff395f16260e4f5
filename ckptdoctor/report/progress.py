"""Progress on stderr: a live bar on a TTY, a plain line every few seconds otherwise (Slurm .out)."""
from __future__ import annotations

import sys
import threading
import time


class Progress:
    def __init__(self, total_bytes: int, label: str, enabled: bool = True, every: float = 5.0):
        self.total, self.label, self.every = total_bytes, label, every
        self.done = 0
        self.t0 = self.last = time.monotonic()
        self.lock = threading.Lock()
        self.enabled = enabled and total_bytes > 0
        self.tty = sys.stderr.isatty()

    def __call__(self, n: int) -> None:
        if not self.enabled:
            return
        with self.lock:
            self.done += n
            now = time.monotonic()
            if now - self.last < (0.2 if self.tty else self.every):
                return
            self.last = now
            self._emit(now)

    def _emit(self, now):
        rate = self.done / max(now - self.t0, 1e-9)
        pct = 100.0 * self.done / self.total
        msg = f"{self.label}: {self.done / 2**30:.2f}/{self.total / 2**30:.2f} GiB ({pct:.0f}%) {rate / 2**20:.0f} MiB/s"
        if self.tty:
            width = 30
            fill = int(width * self.done / self.total)
            sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {msg}\x1b[K")
        else:
            sys.stderr.write(f"ckptdoctor: {msg}\n")
        sys.stderr.flush()

    def close(self):
        if self.enabled and self.tty:
            self._emit(time.monotonic())
            sys.stderr.write("\n")
