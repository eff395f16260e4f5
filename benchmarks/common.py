"""What every benchmark times with: the exit status is checked (a refused or failed run is not a
fast run), the peak RSS comes from the kernel's accounting of the child (wait4), and the figure
reported is the median of the runs."""
from __future__ import annotations

import os
import statistics
import subprocess
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Measure:
    median_s: float
    peak_rss_mib: float   # the largest of the runs' peak resident set sizes
    runs: int


def measure(cmd, runs: int = 5, *, ok=(0,), env=None, setup=None, shell: bool = False) -> Measure:
    ts, rss = [], []
    for _ in range(runs):
        if setup:
            setup()
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, shell=shell)
        _, status, usage = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t
        rc = os.waitstatus_to_exitcode(status)
        err = p.stderr.read().decode(errors="replace")
        p.stderr.close()
        p.returncode = rc
        if rc not in ok:
            raise SystemExit(f"benchmark command failed (exit {rc}, expected {ok}): {cmd}\n{err[-2000:]}")
        ts.append(dt)
        rss.append(usage.ru_maxrss / 1024)  # KiB on Linux
    return Measure(statistics.median(ts), max(rss), runs)
