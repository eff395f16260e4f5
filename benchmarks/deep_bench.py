"""verify --deep vs `cat` of the same files, page-cached (issue 19: goal >= 0.8x).

Two checkpoints written by the real libraries: a DCP save (torch.save archives inside `.distcp`
shards: CRC-32 and NaN/Inf per record) and safetensors shards (NaN/Inf per tensor).  Each at two
sizes, so the figure that matters, marginal throughput ((big - small) bytes / (big - small)
seconds), cancels the interpreter's start-up; the whole-command ratio at the big size is printed
too.  Every command's exit status is checked (common.measure)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import alternate, combined, measure  # noqa: E402

PY = sys.executable
MiB = 1 << 20
ROUNDS = int(os.environ.get("RUNS", "9"))
MAKE = r"""
import sys, torch, torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
kind, out, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
g = torch.Generator().manual_seed(0)
n = max(1, mib // 32)   # 32 MiB tensors, fp32 and bf16 alternating
sd = {f"layers.{i}.w": (torch.randn(2048, 4096, generator=g) if i % 2 else
                        torch.randn(4096, 4096, generator=g).bfloat16()) for i in range(n)}
if kind == "dcp":
    dcp.save(sd, checkpoint_id=out, no_dist=True)
else:
    import os
    os.makedirs(out, exist_ok=True)
    for j in range(0, n, 8):
        part = {k: v for i, (k, v) in enumerate(sd.items()) if j <= i < j + 8}
        save_file(part, f"{out}/model-{j // 8:05d}.safetensors")
"""


def files_of(d: Path) -> list[str]:
    return sorted(str(p) for p in d.iterdir() if p.suffix in (".distcp", ".safetensors"))


def main(big_mib: int = 2048, small_mib: int = 256):
    base = Path(tempfile.mkdtemp(prefix="ckd-deep-", dir=os.environ.get("BENCH_DIR", "/var/tmp")))
    try:
        print(f"verify --deep vs cat, page-cached, {os.cpu_count()} cores; marginal = ({big_mib} MiB - "
              f"{small_mib} MiB) / time difference\n")
        print("| checkpoint | cat GB/s (marginal) | verify --deep GB/s (marginal) | ratio | whole-command ratio "
              f"at {big_mib} MiB |")
        print("|---|---|---|---|---|")
        for kind in ("dcp", "safetensors"):
            t = {}
            for mib in (small_mib, big_mib):
                d = base / f"{kind}-{mib}"
                subprocess.run([PY, "-c", MAKE, kind, str(d), str(mib)], check=True)
                fs = files_of(d)
                size = sum(os.path.getsize(f) for f in fs)
                subprocess.run(["cat", *fs], stdout=subprocess.DEVNULL, check=True)  # page-cache it
                # alternating rounds: the same code read 0.50x and 0.90x on DCP in two unalternated runs
                r = alternate({"cat": lambda: measure(["sh", "-c", f"cat {' '.join(fs)} > /dev/null"], 1),
                               "ckd": lambda: measure([PY, "-m", "ckptdoctor", "verify", "--deep", "-q", str(d)], 1)},
                              ROUNDS)
                t[mib] = (size, combined(r["cat"]).median_s, combined(r["ckd"]).median_s)
            (s0, c0, k0), (s1, c1, k1) = t[small_mib], t[big_mib]
            cat_gbs, ckd_gbs = (s1 - s0) / (c1 - c0) / 1e9, (s1 - s0) / (k1 - k0) / 1e9
            print(f"| {kind} | {cat_gbs:.2f} | {ckd_gbs:.2f} | {ckd_gbs / cat_gbs:.2f}x | {c1 / k1:.2f}x |")
        print("\ncommands: `cat FILES > /dev/null`; `python -m ckptdoctor verify --deep -q DIR`")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
