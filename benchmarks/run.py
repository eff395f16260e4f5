#!/usr/bin/env python3
"""ckptdoctor benchmarks: ratios against public tools run side by side on the same input.

    .venv/bin/python benchmarks/run.py startup      # CLI start-up vs a bare interpreter
    .venv/bin/python benchmarks/run.py structural   # verify of a 512-file / 200k-entry DCP vs torch
    .venv/bin/python benchmarks/run.py checksums    # verify --checksums vs xxhsum/b3sum/sha256sum/cat
    .venv/bin/python benchmarks/run.py all

Each prints a Markdown table; results are recorded by hand in benchmarks/README.md.
Not a test: nothing here asserts a time.
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CKD = [PY, "-m", "ckptdoctor"]
sys.path.insert(0, str(ROOT))


def timeit(cmd, runs=7, env=None, setup=None) -> float:
    ts = []
    for _ in range(runs):
        if setup:
            setup()
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def table(rows, base_label):
    base = dict(rows)[base_label]
    print("| command | median s | ratio |\n|---|---|---|")
    for label, t in rows:
        print(f"| `{label}` | {t:.3f} | {t / base:.2f}x |")


def startup():
    from ckptdoctor.layouts import dcp_writer as W
    d = tempfile.mkdtemp()
    W.write(d, [W.Item("w", (4, 4), (0, 0), (4, 4), [1.0] * 16)])
    rows = [("python -c pass", timeit([PY, "-c", "pass"], 15)),
            ("ckptdoctor --version", timeit([PY, "-m", "ckptdoctor", "--version"], 15)),
            ("ckptdoctor verify <small DCP>", timeit(CKD + ["verify", d], 15))]
    table(rows, "python -c pass")
    shutil.rmtree(d)


def structural(files=512, entries=200_000):
    from ckptdoctor.layouts import dcp_writer as W
    d = tempfile.mkdtemp(prefix="ckd-bench-")
    per = entries // files
    items = [W.Item(f"layers.{f}.p{j}", (per, 1), (0, 0), (1, 1), [0.5], rank=f) for f in range(files)
             for j in range(per)]
    # a tensor per (file, j) with one element: 200k storage entries, 512 shard files
    for it in items:
        it.global_shape = (1, 1)
    t = time.perf_counter()
    W.write(d, items)
    print(f"built {entries} entries in {files} files in {time.perf_counter() - t:.1f}s: {d}")
    torch_cmd = [PY, "-c", "import sys, torch.distributed.checkpoint as dcp; "
                 "dcp.FileSystemReader(sys.argv[1]).read_metadata()", d]
    rows = [("ckptdoctor verify (structural)", timeit(CKD + ["verify", d], 3)),
            ("torch: import dcp + read_metadata()", timeit(torch_cmd, 3))]
    table(rows, "torch: import dcp + read_metadata()")
    shutil.rmtree(d)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    for name, fn in (("startup", startup), ("structural", structural)):
        if what in (name, "all"):
            print(f"\n## {name}\n")
            fn()
    if what in ("checksums", "all"):
        from checksums_bench import main as cb  # noqa
        cb()
