"""What every benchmark times with: the exit status is checked (a refused or failed run is not a
fast run), the peak RSS is GNU time's %M for the command itself (wait4's figure of a forked child
would include the benchmark script's own pages from before the exec: 296 MiB for `python -c pass`),
and the figure reported is the median of the runs."""
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


_COMPILED = []


def compile_package() -> None:
    """Byte-compile ckptdoctor once before anything is timed.  A user's install carries its .pyc
    files; an environment with PYTHONDONTWRITEBYTECODE=1 (this workplace sets it) would otherwise
    compile every module from source on every timed run (~0.15 s of `verify --deep`, measured)."""
    if not _COMPILED:
        import compileall
        import os
        import ckptdoctor
        compileall.compile_dir(os.path.dirname(ckptdoctor.__file__), quiet=1)
        _COMPILED.append(True)


def measure(cmd, runs: int = 5, *, ok=(0,), env=None, setup=None, shell: bool = False) -> Measure:
    """Runs `cmd` from a directory outside this repository (the system temp directory, or
    $BENCH_CWD): from here every ckptdoctor command would find this repository's pyproject.toml,
    which names ckptdoctor, and import tomllib to parse it, ~6 ms a user's run directory does not
    cost.  Every benchmark command names its files by absolute path."""
    import tempfile
    compile_package()
    cwd = os.environ.get("BENCH_CWD") or tempfile.gettempdir()
    ts, rss = [], []
    argv = ["sh", "-c", cmd] if shell else list(cmd)
    with tempfile.NamedTemporaryFile(prefix="ckd-bench-rss-") as out:
        for _ in range(runs):
            if setup:
                setup()
            t = time.perf_counter()
            p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", out.name, *argv], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, env=env, cwd=cwd)
            dt = time.perf_counter() - t
            if p.returncode not in ok:
                raise SystemExit(f"benchmark command failed (exit {p.returncode}, expected {ok}): {cmd}\n"
                                 f"{p.stderr.decode(errors='replace')[-2000:]}")
            ts.append(dt)
            rss.append(int(open(out.name).read().split()[-1]) / 1024)  # KiB
    return Measure(statistics.median(ts), max(rss), runs)


def alternate(runs: dict, rounds: int) -> dict[str, list]:
    """Each round calls every entry of `runs` once, in order; returns each entry's results over
    the rounds.  This VM's speed drifts by up to 2x within minutes (disk and CPU alike): all runs of
    one tool, then all of the next, would record that drift as a difference between the tools."""
    out: dict[str, list] = {k: [] for k in runs}
    for _ in range(rounds):
        for k, fn in runs.items():
            out[k].append(fn())
    return out


def combined(ms: list[Measure]) -> Measure:
    """One Measure from single runs taken in alternating rounds: median time, largest peak."""
    return Measure(statistics.median(m.median_s for m in ms), max(m.peak_rss_mib for m in ms), len(ms))


def build_torch_metadata(d: str, entries: int = 200_000, files: int = 512) -> None:
    """A DCP checkpoint in `d` of `entries` one-element tensors over `files` shards, one storage
    record each, whose `.metadata` is the one torch itself writes.  The torch-free writer emits
    protocol-2 opcodes without memoizing (78 MB against torch's 51 MB at 200k records); torch's
    FileSystemWriter.finish is `pickle.dump(metadata, f)` (torch 2.13 filesystem.py), which
    memoizes every object.  So the writer's file is read by torch and re-dumped by it: the file a
    real run would leave."""
    import subprocess
    import sys
    from ckptdoctor.layouts import dcp_writer as W
    per = entries // files
    items = [W.Item(f"layers.{f}.p{j}", (per, 1), (0, 0), (1, 1), [0.5], rank=f) for f in range(files)
             for j in range(per)]
    for it in items:
        it.global_shape = (1, 1)
    W.write(d, items)
    del items
    subprocess.run([sys.executable, "-c", "import sys, pickle, torch.distributed.checkpoint as dcp; "
                    "md = dcp.FileSystemReader(sys.argv[1]).read_metadata(); "
                    "pickle.dump(md, open(sys.argv[1] + '/.metadata', 'wb'))", d], check=True)
