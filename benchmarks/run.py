#!/usr/bin/env python3
"""ckptdoctor benchmarks: ratios against public tools run side by side on the same input.

    .venv/bin/python benchmarks/run.py startup      # CLI start-up vs a bare interpreter
    .venv/bin/python benchmarks/run.py structural   # verify of a 512-file / 200k-entry DCP vs torch
    .venv/bin/python benchmarks/run.py metadata1m   # the same with 1,000,000 entries (time and peak RSS)
    .venv/bin/python benchmarks/run.py publish      # publish vs cp -r + sync
    .venv/bin/python benchmarks/run.py checksums    # verify --checksums vs xxhsum/b3sum/sha256sum/cat
                                                    # (page-cached, cold, and both as marginal throughput)
    .venv/bin/python benchmarks/run.py parts        # 2-part publish of 4 GiB vs cp -r + sync
    .venv/bin/python benchmarks/run.py manifestwriter  # dcp.save with ManifestWriter vs FileSystemWriter
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


sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Measure, alternate, build_torch_metadata, combined, measure  # noqa: E402


def timeit(cmd, runs=7, env=None, setup=None, ok=(0,)) -> Measure:
    return measure(cmd, runs, ok=ok, env=env, setup=setup)


def table(rows, base_label):
    base = dict(rows)[base_label].median_s
    print("| command | median s | peak RSS MiB | ratio |\n|---|---|---|---|")
    for label, m in rows:
        print(f"| `{label}` | {m.median_s:.3f} | {m.peak_rss_mib:.0f} | {m.median_s / base:.2f}x |")


def startup(rounds: int = 21):
    """Alternating rounds, from outside this repository (see common.measure), as a prolog or a job
    runs it."""
    from ckptdoctor.layouts import dcp_writer as W
    d = tempfile.mkdtemp()
    W.write(d, [W.Item("w", (4, 4), (0, 0), (4, 4), [1.0] * 16)])
    script = os.path.join(os.path.dirname(PY), "ckptdoctor")  # the installed console script
    cmds = {"python -c pass": [PY, "-c", "pass"], "ckptdoctor --version": CKD + ["--version"],
            "python -m ckptdoctor verify <small DCP>": CKD + ["verify", d]}
    if os.path.exists(script):
        cmds["ckptdoctor verify <small DCP> (console script)"] = [script, "verify", d]
    for c in cmds.values():  # a first run compiles the CLI spec and the caches
        subprocess.run(c, stdout=subprocess.DEVNULL, cwd=d)
    r = alternate({k: (lambda c=c: timeit(c, 1)) for k, c in cmds.items()}, rounds)
    table([(k, combined(v)) for k, v in r.items()], "python -c pass")
    shutil.rmtree(d)


def structural(files=512, entries=200_000, runs=3):
    d = tempfile.mkdtemp(prefix="ckd-bench-")
    t = time.perf_counter()
    build_torch_metadata(d, entries, files)   # the .metadata torch itself writes
    print(f"built {entries} entries in {files} files in {time.perf_counter() - t:.1f}s: {d} "
          f"(.metadata as torch writes it: {os.path.getsize(d + '/.metadata') / 1e6:.0f} MB)")
    torch_cmd = [PY, "-c", "import sys, torch.distributed.checkpoint as dcp; "
                 "dcp.FileSystemReader(sys.argv[1]).read_metadata()", d]
    got = alternate({"ours": lambda: timeit(CKD + ["verify", d], 1), "torch": lambda: timeit(torch_cmd, 1)}, runs)
    rows = [("ckptdoctor verify (structural)", combined(got["ours"])),
            ("torch: import dcp + read_metadata()", combined(got["torch"]))]
    table(rows, "torch: import dcp + read_metadata()")
    base = dict(rows)["torch: import dcp + read_metadata()"]
    ours = dict(rows)["ckptdoctor verify (structural)"]
    print(f"peak RSS ratio: {ours.peak_rss_mib / base.peak_rss_mib:.2f}x")
    # The floor of any parser built on the C unpickler: its memo keeps every object a memoizing
    # pickle names until load() returns, so the peak cannot go below what that memo holds
    imp = timeit([PY, "-c", "import torch.distributed.checkpoint"], 1)
    print(f"`import torch.distributed.checkpoint` alone: {imp.peak_rss_mib:.0f} MiB\n")
    subprocess.run([PY, str(Path(__file__).resolve().parent / "memo_floor.py"), d + "/.metadata",
                    str(base.peak_rss_mib)], check=True)
    shutil.rmtree(d)


def readsets(files=512, entries=200_000, nodes=64, per_node=8):
    """preflight's read sets (issue 14) vs the structural verify of the same checkpoint: a 512-rank
    FSDP-style save (every tensor row-sharded over all ranks, one file per rank) plus a few
    replicated tensors, judged for 64 nodes x 8 ranks.  Goal: <= 2x verify."""
    from ckptdoctor.layouts import dcp_writer as W
    d = tempfile.mkdtemp(prefix="ckd-bench-rs-")
    tensors = entries // files
    items = [W.Item(f"layers.{t}.w", (files, 1), (r, 0), (1, 1), [0.5], rank=r)
             for t in range(tensors - 8) for r in range(files)]
    items += [W.Item(f"norm.{t}", (1, 1), (0, 0), (1, 1), [1.0], rank=t % files) for t in range(8 * files)]
    t = time.perf_counter()
    W.write(d, items)
    print(f"built {len(items)} entries in {files} files in {time.perf_counter() - t:.1f}s")
    pre = CKD + ["preflight", d, "--nodelist", f"node[001-{nodes:03d}]", "--ranks-per-node", str(per_node)]
    rows = [("ckptdoctor verify (structural)", timeit(CKD + ["verify", d], 3)),
            (f"ckptdoctor preflight, {nodes} nodes x {per_node} ranks", timeit(pre, 3))]
    table(rows, "ckptdoctor verify (structural)")
    shutil.rmtree(d)


def publish(sizes_gib=(1, 4), runs=int(os.environ.get("RUNS", "5"))):
    """publish (verify + copy + hash + fsync + manifest + rename + tracker) vs `cp -r` + `sync`,
    at each size issue 20 names.  Throughput ratio = cp time / publish time (>= 1.0 is the goal)."""
    for gib in sizes_gib:
        _publish(files=4 * gib, mb=256, runs=runs)


def _r(xs):
    return "/".join(f"{x:.2f}" for x in xs)


def _publish(files, mb, runs):
    from ckptdoctor.layouts import dcp_writer as W
    base = tempfile.mkdtemp(prefix="ckd-bench-pub-")
    src = os.path.join(base, "iter_0000100")
    W.write(src, [W.Item("w", (8, 8), (r * 2, 0), (2, 8), [1.0] * 16, rank=r) for r in range(4)])
    open(os.path.join(src, "metadata.json"), "w").write('{"sharded_backend": "torch_dist"}')
    for r in range(files):
        with open(os.path.join(src, f"optimizer_rank{r}.bin"), "wb") as fh:
            for _ in range(mb):
                fh.write(os.urandom(1 << 20))  # fresh random bytes per MiB: nothing dedupes or compresses
    total = sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src))
    dst = os.path.join(base, "dst")

    def clean():
        shutil.rmtree(dst, ignore_errors=True)
        os.makedirs(dst)
        subprocess.run(["sync"])
    cp = ["sh", "-c", f"cp -r {src} {dst}/ && sync"]
    pub = CKD + ["publish", "--quiet", "--tracker", "none", src, dst]
    # The disk's own limit: the same bytes written around the page cache (O_DIRECT), no copy, no hash
    dd = ["sh", "-c", f"for f in {src}/*; do dd if=$f of={dst}/$(basename $f) bs=8M oflag=direct "
                      f"status=none || exit 1; done"]
    # alternating rounds, so all three see the same page-cache and disk state
    t = {k: [m.median_s for m in ms] for k, ms in alternate(
        {k: (lambda cmd=cmd: timeit(cmd, 1, setup=clean)) for k, cmd in (("cp", cp), ("pub", pub), ("dd", dd))},
        runs).items()}
    a, b, c = (statistics.median(t[k]) for k in ("cp", "pub", "dd"))
    print(f"{files} x {mb} MiB + a small DCP ({total / 2**30:.2f} GiB), median of {runs} "
          f"(all runs: cp {_r(t['cp'])}, publish {_r(t['pub'])}, dd {_r(t['dd'])}):")
    print("| command | median s | GB/s | throughput vs cp+sync |\n|---|---|---|---|")
    print(f"| `dd bs=8M oflag=direct` per file (the disk's write limit) | {c:.3f} | {total / c / 1e9:.2f} | "
          f"{a / c:.2f}x |")
    print(f"| `cp -r` + `sync` | {a:.3f} | {total / a / 1e9:.2f} | 1.00x |")
    print(f"| `ckptdoctor publish` (verify, copy+xxh3, fsync, manifest, rename) | {b:.3f} | "
          f"{total / b / 1e9:.2f} | {a / b:.2f}x |")
    shutil.rmtree(base)


def preflight_local(ckpts=20, ranks=8):
    """Prolog mode on one node: a node-local run root with `ckpts` checkpoints x `ranks` local
    shards (+ .metadata, tracker), vs `find | stat` of the same tree and a bare interpreter."""
    from ckptdoctor.layouts import dcp_writer as W
    base = tempfile.mkdtemp(prefix="ckd-bench-pre-")
    run = os.path.join(base, "n1", "run7")
    for c in range(ckpts):
        d = os.path.join(run, f"iter_{(c + 1) * 100:07d}")
        W.write(d, [W.Item("w", (ranks * 2, 4), (r * 2, 0), (2, 4), [1.0] * 8, rank=r) for r in range(ranks)])
    open(os.path.join(run, "latest_checkpointed_iteration.txt"), "w").write(str(ckpts * 100))
    env = dict(os.environ, SLURMD_NODENAME="n1", SLURM_JOB_NODELIST="n[1-4]", SLURM_NTASKS_PER_NODE=str(ranks))
    rows = [("python -c pass", timeit([PY, "-c", "pass"], 9)),
            ("find RUN -type f -exec stat", timeit(["sh", "-c", f"find {run} -type f -exec stat -c %s {{}} + >/dev/null"], 9)),
            ("ckptdoctor preflight --local RUN", timeit(CKD + ["preflight", "--local", "-q", run], 9, env=env))]
    print(f"{ckpts} checkpoints x {ranks} local ranks on one node of 4:")
    table(rows, "python -c pass")
    shutil.rmtree(base)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    for name, fn in (("startup", startup), ("structural", structural),
                     ("metadata1m", lambda: structural(512, 1_000_000, runs=1)), ("readsets", readsets),
                     ("publish", publish), ("preflight", preflight_local)):
        if what in (name, "all"):
            print(f"\n## {name}\n")
            fn()
    if what in ("checksums", "all"):
        from checksums_bench import cold_marginal, main as cb  # noqa
        cb()
        cold_marginal()
    if what in ("parts", "manifestwriter", "all"):
        import parts_bench  # noqa
        for name in ("parts", "manifestwriter"):
            if what in (name, "all"):
                print(f"\n## {name}\n")
                getattr(parts_bench, name)()
    if what in ("contract", "all"):
        from contract_bench import main as cbench  # noqa
        cbench()
    if what in ("deep", "all"):
        from deep_bench import main as db  # noqa
        db()
