"""verify --checksums vs xxhsum -H128, b3sum, sha256sum and cat on the same files (issue 5).

8 x 256 MiB files in a DCP-like directory; warm (page-cached) and cold (posix_fadvise DONTNEED
before every run).  Peak RSS of hashing one 4 GiB file comes from the child's rusage.

    python benchmarks/checksums_bench.py                 # all of that, then page-cached marginal
    python benchmarks/checksums_bench.py cold-marginal   # cold marginal only (4.5 GiB of new files)
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import statistics
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import alternate, measure  # noqa: E402

PY = sys.executable
MiB = 1 << 20


def make(d: Path, n=8, size=256 * MiB):
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        with open(d / f"__{i}_0.distcp", "wb") as fh:
            for _ in range(size // MiB):
                fh.write(os.urandom(MiB))  # fresh random bytes per MiB: no repeated block
    from ckptdoctor.layouts import dcp_writer as W
    open(d / ".metadata", "wb").write(W.metadata_bytes([]))


def drop(files):
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def run(cmd, files, cold, runs=5):
    return measure(cmd, runs, setup=(lambda: drop(files)) if cold else None, shell=isinstance(cmd, str)).median_s


def tool_cmd(tool: str, d: Path, files: list[str]):
    """The command line `tool` runs on checkpoint `d` (ours) or on its shard files (the others)."""
    q = " ".join(files)
    return {"ckptdoctor verify --checksums": [PY, "-m", "ckptdoctor", "verify", "--checksums", "-q", str(d)],
            "xxhsum -H128": f"xxhsum -H128 {q}", "b3sum": f"b3sum {q}", "cat > /dev/null": f"cat {q} > /dev/null"}[tool]


def _two_sets(sets: dict[str, Path]):
    """Manifests for the "4g" and "512m" checkpoints; (cmd(tool, label), the bytes between the two,
    each set's shard files)."""
    files = {}
    for label, d in sets.items():
        subprocess.run([PY, "-m", "ckptdoctor", "manifest", "-q", str(d)], check=True)
        files[label] = sorted(str(p) for p in d.glob("*.distcp"))
    total = sum(map(os.path.getsize, files["4g"])) - sum(map(os.path.getsize, files["512m"]))
    return (lambda tool, label: tool_cmd(tool, sets[label], files[label])), total, files


def marginal(base: Path, d: Path, files: list[str], runs: int = 5):
    """Page-cached marginal throughput (issue 20): the same tools on 4 GiB and on 512 MiB (the 8
    files hard-linked twice / two of them), throughput = 3.5 GiB / (t_4GiB - t_512MiB), so the
    process start-up of every tool cancels out."""
    from ckptdoctor.layouts import dcp_writer as W
    sets = {}
    for label, picks in (("4g", [(f, k) for f in files for k in (0, 1)]), ("512m", [(f, 0) for f in files[:2]])):
        dd = base / f"m-{label}"
        dd.mkdir()
        for i, (f, _k) in enumerate(picks):
            os.link(f, dd / f"__{i}_0.distcp")
        open(dd / ".metadata", "wb").write(W.metadata_bytes([]))
        sets[label] = dd
    cmd, total, _ = _two_sets(sets)
    tools = ("ckptdoctor verify --checksums", "xxhsum -H128", "b3sum", "cat > /dev/null")
    rate = {}
    for tool in tools:
        diffs = [run(cmd(tool, "4g"), [], False, 1) - run(cmd(tool, "512m"), [], False, 1) for _ in range(runs)]
        rate[tool] = total / statistics.median(diffs)
    print(f"\n### page-cached, marginal: (4 GiB - 512 MiB) / (t(4 GiB) - t(512 MiB)), median of {runs}\n")
    print("| tool | marginal GB/s | vs xxhsum | vs cat |\n|---|---|---|---|")
    for tool in tools:
        print(f"| `{tool}` | {rate[tool] / 1e9:.2f} | {rate[tool] / rate['xxhsum -H128']:.2f}x | "
              f"{rate[tool] / rate['cat > /dev/null']:.2f}x |")


def cold_marginal(rounds: int = int(os.environ.get("RUNS", "7"))):
    """Cold marginal throughput: the same tools on 16 distinct 256 MiB files (4 GiB) and on 2 of
    another set (512 MiB), every file dropped from the page cache before each run, throughput =
    3.5 GiB / (t_4GiB - t_512MiB) per round, median over alternating rounds.  Distinct files,
    because `marginal`'s hard links would be read from the cache the second time."""
    base = Path(tempfile.mkdtemp(prefix="ckd-coldm-", dir=os.environ.get("BENCH_DIR", "/var/tmp")))
    sets = {}
    for label, n in (("4g", 16), ("512m", 2)):
        make(base / label, n=n)
        sets[label] = base / label
    cmd, total, files = _two_sets(sets)
    tools = ("ckptdoctor verify --checksums", "cat > /dev/null", "b3sum", "xxhsum -H128")
    whole = {t: [] for t in tools}

    def one(tool):
        big = run(cmd(tool, "4g"), files["4g"], True, 1)
        small = run(cmd(tool, "512m"), files["512m"], True, 1)
        whole[tool].append(big)
        return big - small
    diffs = alternate({t: (lambda t=t: one(t)) for t in tools}, rounds)
    rate = {t: total / statistics.median(diffs[t]) for t in tools}
    print(f"\n### cold, marginal: (4 GiB - 512 MiB) / (t(4 GiB) - t(512 MiB)), distinct files dropped "
          f"from the page cache before each run, median of {rounds} alternating rounds\n")
    print("| tool | marginal GB/s | vs cat | whole 4 GiB run, median s | whole run vs cat |\n|---|---|---|---|---|")
    cat_whole = statistics.median(whole["cat > /dev/null"])
    for t in tools:
        w = statistics.median(whole[t])
        print(f"| `{t}` | {rate[t] / 1e9:.2f} | {rate[t] / rate['cat > /dev/null']:.2f}x | {w:.3f} | "
              f"{cat_whole / w:.2f}x |")
    print("\nper-round marginal s: " + "; ".join(f"{t.split()[0]} " + "/".join(f"{x:.2f}" for x in diffs[t])
                                         for t in tools))
    shutil.rmtree(base)


def main():
    base = Path(tempfile.mkdtemp(prefix="ckd-hash-", dir=os.environ.get("BENCH_DIR", "/var/tmp")))
    d = base / "ck"
    make(d)
    subprocess.run([PY, "-m", "ckptdoctor", "manifest", "-q", str(d)], check=True)
    files = sorted(str(p) for p in d.glob("*.distcp"))
    total = sum(os.path.getsize(f) for f in files)
    q = " ".join(files)
    cmds = {"ckptdoctor verify --checksums": [PY, "-m", "ckptdoctor", "verify", "--checksums", "-q", str(d)],
            "xxhsum -H128": f"xxhsum -H128 {q}", "b3sum": f"b3sum {q}", "sha256sum": f"sha256sum {q}",
            "cat > /dev/null": f"cat {q} > /dev/null"}
    for cold in (False, True):
        print(f"\n### {'cold (fadvise DONTNEED)' if cold else 'page-cached'}: 8 x 256 MiB\n")
        print("| tool | median s | GB/s | vs xxhsum | vs cat |\n|---|---|---|---|---|")
        rounds = alternate({k: (lambda c=c: run(c, files, cold, runs=1)) for k, c in cmds.items()},
                           int(os.environ.get("RUNS", "5")))
        res = {k: statistics.median(v) for k, v in rounds.items()}
        for k, t in res.items():
            print(f"| `{k}` | {t:.3f} | {total / t / 1e9:.2f} | {res['xxhsum -H128'] / t:.2f}x | "
                  f"{res['cat > /dev/null'] / t:.2f}x |")
    marginal(base, d, files)
    big = base / "big"
    big.mkdir()
    with open(big / "__0_0.distcp", "wb") as fh:
        block = os.urandom(MiB)  # one block repeated: this case measures memory, not hashing speed
        for _ in range(4096):
            fh.write(block)
    open(big / ".metadata", "wb").write(open(d / ".metadata", "rb").read())
    m = measure([PY, "-c", "import sys; from ckptdoctor.commands.manifest import write_manifest; "
                 "write_manifest(sys.argv[1], quiet=True, force=True)", str(big)], runs=1)
    base_m = measure([PY, "-c", "import ckptdoctor.commands.manifest"], runs=3)
    print(f"\npeak RSS hashing a 4 GiB file: {m.peak_rss_mib:.0f} MiB "
          f"(interpreter + imports alone: {base_m.peak_rss_mib:.0f} MiB)")
    shutil.rmtree(base)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    cold_marginal() if sys.argv[1:] == ["cold-marginal"] else main()
