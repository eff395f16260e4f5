"""Progress on stderr: a live bar on a TTY (redrawn within the terminal's width), a plain line every
10 s otherwise (a Slurm .out file shows a long --checksums run is alive without filling the log)."""
from __future__ import annotations

import sys
import threading
import time


class Progress:
    def __init__(self, total_bytes: int, label: str, enabled: bool = True, every: float = 10.0):
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
        from .text import duration
        elapsed = now - self.t0
        rate = self.done / max(elapsed, 1e-9)
        pct = 100.0 * self.done / self.total
        eta = (self.total - self.done) / rate if rate > 0 and self.done < self.total else 0.0
        unit, div = ("GiB", 2**30) if self.total >= 2**30 else ("MiB", 2**20)
        msg = (f"{self.label}: {self.done / div:.2f}/{self.total / div:.2f} {unit} ({pct:.0f}%), "
               f"{rate / 2**20:.0f} MiB/s, {duration(elapsed)} elapsed"
               + (f", about {duration(eta)} left" if self.done < self.total else ""))
        if self.tty:
            import shutil
            cols = shutil.get_terminal_size((80, 24)).columns
            width = 30 if cols >= 80 else 10
            fill = int(width * self.done / self.total)
            line = f"[{'#' * fill}{'.' * (width - fill)}] {msg}"
            sys.stderr.write("\r" + line[:max(1, cols - 1)] + "\x1b[K")  # a wrapped line would not redraw
        else:
            sys.stderr.write(f"ckptdoctor: {msg}\n")
        sys.stderr.flush()

    def close(self):
        """The final state on its own clean line, also when the work was interrupted."""
        if self.enabled and self.tty:
            self._emit(time.monotonic())
            sys.stderr.write("\n")
            sys.stderr.flush()
