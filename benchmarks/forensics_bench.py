"""`ckptdoctor forensics` on a large log, side by side with grep (issue 43).

    .venv/bin/python benchmarks/forensics_bench.py [--gib 2] [--dir /tmp]

Builds a log of about --gib GiB: timestamped training noise from 8 ranks (the bulk of any real job
log), with the real DeepSpeed failure of tests/fixtures/real/forensics/deepspeed-optim-missing (rank 1's
FileNotFoundError, rank 0's lost peer) in the middle, and a collective timeout from every rank near the
end.  Then, median of 3 runs each:

  ckptdoctor forensics LOG --format json     wall time, peak RSS (VmHWM of the process)
  grep -c -e Traceback -e rror LOG           the same bytes read by a public tool that only counts
  grep -n Traceback LOG | head -1             ... and finds the first traceback

and checks that forensics still names rank 1 and the optimizer file (a benchmark that got faster by
reading less would fail here).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REAL = os.path.join(HERE, "..", "tests", "fixtures", "real", "forensics", "deepspeed-optim-missing")


def build(path: str, gib: float) -> int:
    noise = "".join(f"2026-12-03 17:{(i // 60) % 60:02d}:{i % 60:02d}.000 rank{i % 8} INFO step {i} loss 1.{i % 97} "
                    f"lr 3.0e-4 tokens/s 91234 grad_norm 0.{i % 89}\n" for i in range(20000)).encode()
    real = b"".join(open(os.path.join(REAL, n), "rb").read() for n in ("task-1.out", "task-0.out"))
    timeouts = b"".join(f"[rank{r}]: torch.distributed.DistBackendError: [Rank {r}] Watchdog caught collective "
                        f"operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600000 ms\n".encode()
                        for r in range(8))
    target = int(gib * (1 << 30))
    with open(path, "wb") as fh:
        written = 0
        while written < target // 2:
            fh.write(noise)
            written += len(noise)
        fh.write(real)
        while written < target:
            fh.write(noise)
            written += len(noise)
        fh.write(timeouts)
    return os.path.getsize(path)


def timed(cmd: list[str], shell: bool = False) -> tuple[float, str]:
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, shell=shell)
    return time.perf_counter() - t, p.stdout


def forensics_run(log: str) -> tuple[float, int, dict]:
    code = ("import json, sys; from ckptdoctor import api; r = api.forensics([sys.argv[1]]); "
            "hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')); "
            "print(json.dumps({'hwm_kib': hwm, 'first': r.facts['first_failure'], 'lines': r.facts['logs']['lines']}))")
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code, log], capture_output=True, text=True, check=True)
    dt = time.perf_counter() - t
    doc = json.loads(p.stdout)
    return dt, doc["hwm_kib"], doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    log = os.path.join(args.dir, "ckptdoctor-forensics-bench.log")
    size = build(log, args.gib)
    try:
        f_times, hwm, doc = [], 0, None
        for _ in range(args.runs):
            dt, h, doc = forensics_run(log)
            f_times.append(dt)
            hwm = max(hwm, h)
        first = doc["first"]
        assert first["ranks"] == [1] and first["path"].endswith("zero_pp_rank_1_mp_rank_00_optim_states.pt"), first
        g_count = [timed(["grep", "-c", "-e", "Traceback", "-e", "rror", log])[0] for _ in range(args.runs)]
        g_first = [timed(f"grep -n Traceback {log} | head -1", shell=True)[0] for _ in range(args.runs)]
        base = statistics.median(g_count)
        print(f"log: {size / (1 << 30):.2f} GiB, {doc['lines']} lines")
        print("| command | median s | ratio to grep -c | peak RSS |")
        print("|---|---|---|---|")
        print(f"| `grep -c -e Traceback -e rror` | {base:.2f} | 1.00x | |")
        print(f"| `grep -n Traceback \\| head -1` | {statistics.median(g_first):.2f} | "
              f"{statistics.median(g_first) / base:.2f}x | |")
        print(f"| `ckptdoctor forensics` | {statistics.median(f_times):.2f} | {statistics.median(f_times) / base:.2f}x "
              f"| {hwm / 1024:.0f} MiB |")
    finally:
        os.remove(log)


if __name__ == "__main__":
    main()
