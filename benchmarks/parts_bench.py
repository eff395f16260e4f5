"""Issue 17 benchmarks (ratios against public tools / torch itself, side by side, medians):

  parts           a 2-part publish (two "nodes": directories standing for node-local disks, each with
                  its ranks' shards and a copy of the global files; two `publish --part` processes at
                  once) of 4 GiB vs `cp -r` of the same bytes + `sync`
  manifestwriter  dcp.save of the same state with ckptdoctor's ManifestWriter vs torch's plain
                  FileSystemWriter (single process, thread_count 1 and 4), save time ratio

    .venv/bin/python benchmarks/run.py parts
    .venv/bin/python benchmarks/run.py manifestwriter
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
sys.path.insert(0, str(ROOT))


def _drop_dst(dst):
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    subprocess.run(["sync"])


def parts(files_per_node=8, mb=256, runs=5):
    from ckptdoctor.layouts import dcp_writer as W
    base = tempfile.mkdtemp(prefix="ckd-bench-parts-")
    full = os.path.join(base, "full", "iter_0000100")
    W.write(full, [W.Item("w", (8, 8), (r * 2, 0), (2, 8), [1.0] * 16, rank=r) for r in range(4)])
    open(os.path.join(full, "metadata.json"), "w").write('{"sharded_backend": "torch_dist"}')
    nodes = []
    for n in range(2):
        d = os.path.join(base, f"n{n}", "iter_0000100")
        os.makedirs(d)
        for f in os.listdir(full):
            if not f.startswith("__") or int(f[2:].split("_")[0]) // 2 == n:
                shutil.copy2(os.path.join(full, f), d)
        for r in range(files_per_node):
            with open(os.path.join(d, f"optimizer_rank{n * files_per_node + r}.bin"), "wb") as fh:
                for _ in range(mb):
                    fh.write(os.urandom(1 << 20))
        nodes.append(d)
    total = sum(os.path.getsize(os.path.join(d, f)) for d in nodes for f in os.listdir(d))
    dst = os.path.join(base, "dst")
    cp = f"mkdir -p {dst}/iter_0000100 && cp -r {nodes[0]}/. {nodes[1]}/. {dst}/iter_0000100/ && sync"
    t_cp, t_pub = [], []
    for i in range(runs):  # alternate, so both see the same page-cache state
        _drop_dst(dst)
        t = time.perf_counter()
        subprocess.run(["sh", "-c", cp], check=True)
        t_cp.append(time.perf_counter() - t)
        _drop_dst(dst)
        t = time.perf_counter()
        procs = [subprocess.Popen([PY, "-m", "ckptdoctor", "publish", "--quiet", "--tracker", "none", nodes[k], dst,
                                   "--part", f"{k}/2", "--publish-id", f"b{i}"], stdout=subprocess.DEVNULL)
                 for k in range(2)]
        if any(p.wait() != 0 for p in procs):
            raise SystemExit("a part failed")
        t_pub.append(time.perf_counter() - t)
    a, b = statistics.median(t_cp), statistics.median(t_pub)
    print(f"2 nodes x ({files_per_node} x {mb} MiB + their DCP shards and global files), "
          f"{total / 2**30:.2f} GiB read, median of {runs}:")
    print("| command | median s | GB/s | throughput vs cp+sync |\n|---|---|---|---|")
    print(f"| `cp -r` both nodes' dirs + `sync` | {a:.3f} | {total / a / 1e9:.2f} | 1.00x |")
    print(f"| 2 x `ckptdoctor publish --part K/2` at once | {b:.3f} | {total / b / 1e9:.2f} | {a / b:.2f}x |")
    shutil.rmtree(base)


def manifestwriter(mb=1024, runs=7):
    import torch
    import torch.distributed.checkpoint as dcp
    from ckptdoctor.integrations.dcp import ManifestWriter
    n = mb * (1 << 20) // 4 // 16
    g = torch.Generator().manual_seed(0)
    sd = {f"layer{i}.w": torch.randn(n // 1024, 1024, generator=g) for i in range(16)}
    base = tempfile.mkdtemp(prefix="ckd-bench-mw-")
    print(f"dcp.save of 16 fp32 tensors, {mb} MiB in all, single process, page cache warm, median of {runs}:")
    print("| thread_count | FileSystemWriter s | ManifestWriter s | ratio |\n|---|---|---|---|")
    for threads in (1, 4):
        t_plain, t_mw = [], []
        for i in range(runs):
            pair = [(dcp.FileSystemWriter, t_plain), (ManifestWriter, t_mw)]
            for cls, ts in (pair if i % 2 == 0 else pair[::-1]):  # alternate: the second save of a pair
                d = os.path.join(base, f"{cls.__name__}{i}")       # meets the first one's writeback
                os.sync()
                t = time.perf_counter()
                dcp.save(sd, storage_writer=cls(d, thread_count=threads), no_dist=True)
                ts.append(time.perf_counter() - t)
                shutil.rmtree(d)
        a, b = statistics.median(t_plain), statistics.median(t_mw)
        print(f"| {threads} | {a:.3f} | {b:.3f} | **{b / a:.3f}x** |")
    shutil.rmtree(base)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "parts"
    {"parts": parts, "manifestwriter": manifestwriter}[what]()
