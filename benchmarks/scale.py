"""Scale benchmarks (issue 8): verify's wall time and peak RSS as inputs grow 10x.

    .venv/bin/python benchmarks/scale.py [runroot|metadata|index|all]

Each case is measured at two sizes, 10x apart, in fresh subprocesses (`/usr/bin/time -f`), so
growth can be read directly: 10x more entries should cost at most about 10x.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PY = sys.executable


def measure(args, runs=2):
    best = None
    for _ in range(runs):
        r = _run_ckd(["verify", "-q", *args])
        best = r if best is None or r[0] < best[0] else best
    return best


def runroot(ckpts: int, files: int = 1024) -> tuple:
    from ckptdoctor.layouts import dcp_writer as W
    d = tempfile.mkdtemp(prefix="ckd-scale-run-")
    t = time.perf_counter()
    for c in range(ckpts):
        W.write(f"{d}/iter_{(c + 1) * 100:07d}",
                [W.Item("w", (files, 1), (r, 0), (1, 1), [1.0], rank=r) for r in range(files)])
        open(f"{d}/iter_{(c + 1) * 100:07d}/metadata.json", "w").write('{"sharded_backend": "torch_dist"}')
    open(f"{d}/latest_checkpointed_iteration.txt", "w").write(str(ckpts * 100))
    build = time.perf_counter() - t
    r = measure([d])
    shutil.rmtree(d)
    return f"run root, {ckpts} checkpoints x {files} shard files", ckpts * files, build, r


def metadata(entries: int, files: int = 1024) -> tuple:
    from ckptdoctor.layouts import dcp_writer as W
    d = tempfile.mkdtemp(prefix="ckd-scale-md-")
    per = entries // files
    items = [W.Item(f"l.{f}.p{j}", (1, 1), (0, 0), (1, 1), [0.5], rank=f) for f in range(files) for j in range(per)]
    t = time.perf_counter()
    W.write(d, items)
    build = time.perf_counter() - t
    del items
    r = measure([d], runs=1)
    shutil.rmtree(d)
    return f"DCP .metadata, {entries} storage entries", entries, build, r


def index(tensors: int, shards: int = 100) -> tuple:
    import numpy as np
    from safetensors.numpy import save_file
    d = tempfile.mkdtemp(prefix="ckd-scale-st-")
    per = tensors // shards
    t = time.perf_counter()
    wm = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        ts = {f"layers.{s}.t{j}": np.zeros((2,), dtype=np.float32) for j in range(per)}
        save_file(ts, f"{d}/{name}")
        wm.update({k: name for k in ts})
    json.dump({"metadata": {"total_size": 8 * per * shards}, "weight_map": wm},
              open(f"{d}/model.safetensors.index.json", "w"))
    build = time.perf_counter() - t
    r = measure([d])
    shutil.rmtree(d)
    return f"safetensors index, {tensors} tensors in {shards} shards", tensors, build, r


def _timed_py(code: str, *args) -> tuple:
    """(seconds, peak RSS MiB, exit) of `python -c code args` under /usr/bin/time."""
    p = subprocess.run(["/usr/bin/time", "-f", "%e %M", PY, "-c", code, *map(str, args)], capture_output=True,
                       text=True)
    secs, kb = [ln for ln in p.stderr.strip().splitlines() if not ln.startswith("Command exited")][-1].split()
    if p.returncode != 0:
        raise SystemExit(f"benchmark failed: {p.stderr[-1000:]}")
    return float(secs), int(kb) / 1024, p.returncode


def coverage(chunks: int) -> tuple:
    """Chunk coverage of one tensor: `chunks` column chunks (the case that was O(n^2): 8,000 took
    24 s), checked by the library call verify uses, in a fresh interpreter."""
    code = ("import sys; from ckptdoctor.layouts.coverage import problems; n = int(sys.argv[1]); "
            "assert problems((4, n), [((0, i), (4, 1)) for i in range(n)]) == []")
    return f"chunk coverage, {chunks} column chunks of one tensor", chunks, 0.0, _timed_py(code, chunks)


def preflight_nodes(nodes: int) -> tuple:
    """preflight's judgement over `nodes` nodes x 8 ranks of one shared checkpoint (the case that
    was O(nodes^2): 20k nodes took 29 s)."""
    from ckptdoctor.layouts import dcp_writer as W
    d = tempfile.mkdtemp(prefix="ckd-scale-pf-")
    W.write(f"{d}/iter_0000100", [W.Item("w", (64, 4), (8 * r, 0), (8, 4), [1.0] * 32, rank=r) for r in range(8)])
    open(f"{d}/latest_checkpointed_iteration.txt", "w").write("100")
    r = _run_ckd(["preflight", "-q", "-f", "json", d, "--nodelist", f"n[1-{nodes}]", "--ranks-per-node", "8"])
    shutil.rmtree(d)
    return f"preflight, {nodes} nodes x 8 ranks (shared location)", nodes, 0.0, r


def _run_ckd(args) -> tuple:
    """(seconds, peak RSS MiB, exit); a run that was refused or crashed (exit 2, 3) is not a result."""
    p = subprocess.run(["/usr/bin/time", "-f", "%e %M", PY, "-m", "ckptdoctor", *args], capture_output=True, text=True)
    secs, kb = [ln for ln in p.stderr.strip().splitlines() if not ln.startswith("Command exited")][-1].split()
    if p.returncode not in (0, 1):
        raise SystemExit(f"benchmark run failed (exit {p.returncode}): ckptdoctor {' '.join(args)}\n{p.stderr[-1000:]}")
    return float(secs), int(kb) / 1024, p.returncode


CASES = {"runroot": (runroot, (10, 100)), "metadata": (metadata, (100_000, 1_000_000)),
         "index": (index, (20_000, 200_000)), "coverage": (coverage, (10_000, 100_000)),
         "preflight": (preflight_nodes, (10_000, 100_000))}

if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    print("| input | entries | verify s | peak RSS MiB | exit | s per 1k entries |\n|---|---|---|---|---|---|")
    for name, (fn, sizes) in CASES.items():
        if what not in ("all", name):
            continue
        for n in sizes:
            label, entries, build, (secs, mib, rc) = fn(n)
            print(f"| {label} | {entries} | {secs:.2f} | {mib:.0f} | {rc} | {1000 * secs / entries:.3f} |",
                  flush=True)
