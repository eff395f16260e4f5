"""Run-contract data hashing vs `xxhsum -H128` of the same files (issue 18), page-cached.

8 x 128 MiB data files; `ckptdoctor contract check RUN` re-hashes every data file the contract
names (plus the code and recipe, here none); xxhsum -H128 hashes the same files on one core.
Every command's exit status is checked (common.measure)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import measure  # noqa: E402

PY = sys.executable
MiB = 1 << 20


def main(n: int = 8, mib: int = 128):
    base = Path(tempfile.mkdtemp(prefix="ckd-contract-", dir=os.environ.get("BENCH_DIR", "/var/tmp")))
    try:
        data, run = base / "data", base / "run"
        data.mkdir()
        run.mkdir()
        for i in range(n):
            with open(data / f"shard-{i:03d}.bin", "wb") as fh:
                for _ in range(mib):
                    fh.write(os.urandom(MiB))
        subprocess.run([PY, "-m", "ckptdoctor", "contract", "init", str(run), "--data", str(data), "-q"], check=True,
                       stdout=subprocess.DEVNULL)
        files = sorted(str(p) for p in data.iterdir())
        subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
        xx = measure(["xxhsum", "-H128", *files], 5).median_s
        ckd = measure([PY, "-m", "ckptdoctor", "contract", "check", "-q", str(run)], 5).median_s
        py = measure([PY, "-c", "pass"], 5).median_s
        empty = base / "empty"
        empty.mkdir()
        subprocess.run([PY, "-m", "ckptdoctor", "contract", "init", str(empty), "--total-steps", "1", "-q"],
                       check=True, stdout=subprocess.DEVNULL)
        t0 = measure([PY, "-m", "ckptdoctor", "contract", "check", "-q", str(empty)], 5).median_s
        gib = n * mib / 1024
        print(f"{gib:.0f} GiB in {n} files, page-cached, {os.cpu_count()} cores\n")
        print("| command | median | GB/s | ratio (xxhsum / command) |\n|---|---|---|---|")
        for name, t in (("xxhsum -H128 FILES", xx), ("ckptdoctor contract check RUN", ckd), ("python -c pass", py)):
            print(f"| `{name}` | {t:.3f} s | {n * mib * MiB / t / 1e9:.2f} | {xx / t:.2f}x |")
        print(f"\nmarginal (start-up of a contract check without data, {t0:.3f} s, subtracted): "
              f"{n * mib * MiB / (ckd - t0) / 1e9:.2f} GB/s = {(ckd - t0) and xx / (ckd - t0):.2f}x xxhsum")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
