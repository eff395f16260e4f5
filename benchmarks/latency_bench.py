"""Issue 42: ckptdoctor where checkpoints really live -- storage whose metadata calls are round trips.

    .venv/bin/python benchmarks/latency_bench.py [posix|fuse|s3|preflight|prune|publish|all] [--shards 4096] [--delay-ms 2]
        [--read-delay-ms 0]   # also charge each read of file data (a cold read on Lustre/GPFS: a data round trip)

posix: a run root of 3 checkpoints x N shards (Megatron torch_dist layout, written by the torch-free
  DCP writer) behind benchmarks/latency/delayed.py (each stat/open/readdir sleeps --delay-ms, calls
  from several threads answered together).  Side by side: the plain tool (`find ROOT -printf
  '%s\\n'` done through the same layer, serially and with the same parallelism as ckptdoctor) and
  `ckptdoctor verify --target resume ROOT` (the relaunch gate), serial (CKPTDOCTOR_IO_THREADS=1)
  and default.  Reports wall time, operations by kind and per file, and the most in flight.
fuse: the same tree through the FUSE passthrough (benchmarks/latency/delayfs.py; needs /dev/fuse,
  fuse3 and mfusepy): what real system calls reach the filesystem, counted by the daemon, for the
  real `find` and for ckptdoctor.  Wall times there measure the FUSE client too (see delayed.py).
s3: the same run root on moto's S3 server behind benchmarks/latency/s3proxy.py (20 ms per request):
  LIST, HEAD and GET counts for the gate and for the plain listing (s3fs find); each run once
  answered by moto, then (best of 3) by the proxy replaying moto's recorded answers after the delay.
publish: `publish` of one checkpoint of N shards into a run root, against a plain durable copy
  (open both sides, copy, fsync, per file) through the same layer, serial and 16 threads.
preflight: `preflight` of M node views (one checkpoint spread over M node-local directories),
  through the same in-process layer.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PY = sys.executable
LAYER = str(ROOT / "benchmarks" / "latency" / "delayed.py")


def build_run_root(d: str, ckpts: int, shards: int) -> int:
    from ckptdoctor.layouts import dcp_writer as W
    for c in range(ckpts):
        p = f"{d}/iter_{(c + 1) * 100:07d}"
        W.write(p, [W.Item("w", (shards, 1), (r, 0), (1, 1), [1.0], rank=r) for r in range(shards)])
        open(f"{p}/metadata.json", "w").write('{"sharded_backend": "torch_dist"}')
    open(f"{d}/latest_checkpointed_iteration.txt", "w").write(str(ckpts * 100))
    return sum(len(fs) for _, _, fs in os.walk(d))


def layered(args: list[str], delay_ms: float, files: int, env=None, runs: int = 3, under: str = "") -> dict:
    """The best of `runs` runs of delayed.py (its own wall clock, operation counts); only calls on
    paths under `under` (the storage measured) are charged the delay."""
    best = None
    for _ in range(runs):
        with tempfile.NamedTemporaryFile(suffix=".json") as st:
            p = subprocess.run([PY, LAYER, "--delay-ms", str(delay_ms), "--read-delay-ms", str(READ_DELAY_MS),
                                "--stats", st.name, "--files", str(files),
                                *(["--only-under", under] if under else []), *args],
                               capture_output=True, text=True, env={**os.environ, **(env or {})})
            r = json.load(open(st.name))
        r["rc"] = p.returncode
        best = r if best is None or r["wall_s"] < best["wall_s"] else best
    return best


def row(name: str, r: dict, base: float | None) -> str:
    ops = ", ".join(f"{k} {v}" for k, v in sorted(r["ops"].items()))
    per = ", ".join(f"{k} {v}" for k, v in sorted(r.get("ops_per_file", {}).items()))
    ratio = f"{r['wall_s'] / base:.2f}x" if base else ""
    return f"| {name} | {r['wall_s']:.2f} | {ratio} | {r['max_in_flight']} | {ops} | {per} |"


def table(title: str, res: dict) -> None:
    print(f"\n### {title}\n")
    print("| command | wall s | | max in flight | operations | per file |")
    print("|---|---|---|---|---|---|")
    for k, r in res.items():
        print(row(k, r, None) + f" rc {r['rc']}")


def posix(shards: int, delay_ms: float) -> None:
    d = tempfile.mkdtemp(prefix="ckd-lat-")
    try:
        files = build_run_root(d, 3, shards)
        threads = int(os.environ.get("CKPTDOCTOR_IO_THREADS", "64"))
        res = {
            "plain find, serial": layered(["--plain-find", "--threads", "1", "--", d], delay_ms, files, runs=1, under=d),
            f"plain find, {threads} threads": layered(["--plain-find", "--threads", str(threads), "--", d],
                                                      delay_ms, files, under=d),
            "ckptdoctor gate, serial (CKPTDOCTOR_IO_THREADS=1)": layered(
                ["--", "verify", "-q", "--target", "resume", d], delay_ms, files,
                env={"CKPTDOCTOR_IO_THREADS": "1"}, runs=1, under=d),
            f"ckptdoctor gate, default ({threads} in flight)": layered(
                ["--", "verify", "-q", "--target", "resume", d], delay_ms, files, under=d),
            "ckptdoctor verify (every checkpoint)": layered(["--", "verify", "-q", d], delay_ms, files, under=d),
        }
        base = res[f"plain find, {threads} threads"]["wall_s"]
        print(f"\n### posix: 3 checkpoints x {shards} shards ({files} files), {delay_ms} ms per metadata call\n")
        print("| command | wall s | vs parallel find | max in flight | operations | per file |")
        print("|---|---|---|---|---|---|")
        for k, r in res.items():
            print(row(k, r, base))
    finally:
        shutil.rmtree(d)


def fuse(shards: int, delay_ms: float) -> None:
    import importlib.util
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3") or not importlib.util.find_spec("mfusepy"):
        print("fuse: skipped (needs /dev/fuse, fuse3 and mfusepy)")
        return
    d = tempfile.mkdtemp(prefix="ckd-lat-")
    mnt = tempfile.mkdtemp(prefix="ckd-mnt-")
    try:
        files = build_run_root(d, 3, shards)
        print(f"\n### fuse: 3 checkpoints x {shards} shards ({files} files), {delay_ms} ms per request\n")
        print("| command | wall s | max in flight | requests reaching the filesystem |")
        print("|---|---|---|---|")
        for name, cmd in (("find ROOT -printf '%s\\n'", ["find", mnt, "-printf", "%s\\n"]),
                          ("ckptdoctor verify --target resume", [PY, "-m", "ckptdoctor", "verify", "-q",
                                                                 "--target", "resume", mnt])):
            stats = os.path.join(d, "..", f"fuse-{os.getpid()}.json")
            daemon = subprocess.Popen([PY, str(ROOT / "benchmarks" / "latency" / "delayfs.py"), d, mnt,
                                       "--delay-ms", str(delay_ms), "--stats", stats])
            for _ in range(100):
                if os.path.ismount(mnt):
                    break
                time.sleep(0.05)
            t = time.perf_counter()
            subprocess.run(cmd, capture_output=True, cwd=str(ROOT))
            wall = time.perf_counter() - t
            subprocess.run(["fusermount3", "-u", mnt])
            daemon.wait(30)
            r = json.load(open(stats))
            os.unlink(stats)
            print(f"| {name} | {wall:.2f} | {r['max_in_flight']} | "
                  + ", ".join(f"{k} {v}" for k, v in sorted(r["ops"].items())) + " |")
    finally:
        shutil.rmtree(d)
        os.rmdir(mnt)


def s3(shards: int, delay_ms: float) -> None:
    from moto.server import ThreadedMotoServer
    import fsspec
    sys.path.insert(0, str(ROOT / "benchmarks" / "latency"))
    from s3proxy import S3Proxy
    import logging
    logging.getLogger("werkzeug").setLevel(logging.ERROR)   # moto's server logs every request
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    srv.start()
    host, port = srv.get_host_and_port()
    proxy = S3Proxy(f"http://{host}:{port}", 0.0).start()
    env = {"FSSPEC_S3_ENDPOINT_URL": proxy.url, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
           "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update(env)
    d = tempfile.mkdtemp(prefix="ckd-lat-")
    try:
        files = build_run_root(d, 3, shards)
        fs = fsspec.filesystem("s3", endpoint_url=proxy.url, skip_instance_cache=True)
        fs.mkdir("ckpts")
        t = time.perf_counter()
        fs.put(d + "/", "ckpts/run/", recursive=True)
        print(f"(uploaded {files} objects in {time.perf_counter() - t:.0f} s)", file=sys.stderr)
        print(f"\n### s3: 3 checkpoints x {shards} shards ({files} objects) on moto, {delay_ms} ms per request\n")
        print("| command | answered by | delay ms | wall s | max in flight | requests |")
        print("|---|---|---|---|---|---|")
        commands = (("plain listing (s3fs find, sizes)", [PY, "-c",
                     "import fsspec,os; fs=fsspec.filesystem('s3', endpoint_url=os.environ["
                     "'FSSPEC_S3_ENDPOINT_URL']); print(sum(v['size'] for v in "
                     "fs.find('ckpts/run', detail=True).values()))"]),
                    ("ckptdoctor verify --target resume", [PY, "-m", "ckptdoctor", "verify", "-q",
                                                           "--target", "resume", "s3://ckpts/run"]))
        # moto first (which records every answer), then the recorded answers after the delay: the
        # client's round trips without moto's ~0.5 s of Python per LIST page (s3proxy.py)
        plan = [(False, 0.0, 1), (False, delay_ms, 1), (True, 0.0, 3), (True, delay_ms, 3)]
        for (name, cmd), (replay, delay, runs) in [(c, p) for c in commands for p in plan]:
            proxy.delay, proxy.replay = delay / 1000, replay
            best = None
            for _ in range(runs):
                proxy.reset()
                t = time.perf_counter()
                p = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT), env={**os.environ, **env})
                wall = time.perf_counter() - t
                if best is None or wall < best[0]:
                    best = (wall, proxy.stats(), p)
            wall, r, p = best
            by = f"replay ({r['replayed']} of {sum(r['ops'].values())})" if replay else "moto"
            print(f"| {name} | {by} | {delay:g} | {wall:.2f} | {r['max_in_flight']} | "
                  + ", ".join(f"{k} {v}" for k, v in sorted(r["ops"].items())) + f" | rc {p.returncode}")
            if p.returncode != 0:
                print(p.stdout[-2000:], p.stderr[-2000:], file=sys.stderr)
    finally:
        shutil.rmtree(d)
        proxy.stop()
        srv.stop()


def prune(shards: int, delay_ms: float) -> None:
    """prune --keep-last 1 of 3 checkpoints: two checkpoints' files removed, against rm -rf of the
    same two directories through the same layer (each run on a fresh copy of the run root)."""
    d = tempfile.mkdtemp(prefix="ckd-lat-prune-")
    try:
        res = {}
        for name, args, env in (
                ("rm -rf of the two checkpoints (serial)", ["--plain-rm", "--"], None),
                ("ckptdoctor prune --keep-last 1, serial (CKPTDOCTOR_IO_THREADS=1)", ["--", "prune", "-q",
                                                                                       "--keep-last", "1"],
                 {"CKPTDOCTOR_IO_THREADS": "1"}),
                ("ckptdoctor prune --keep-last 1, default", ["--", "prune", "-q", "--keep-last", "1"], None)):
            root = os.path.join(d, "run")
            files = build_run_root(root, 3, shards)
            tail = [f"{root}/iter_0000100", f"{root}/iter_0000200"] if args[0] == "--plain-rm" else [root]
            res[name] = layered([*args, *tail], delay_ms, files, env=env, runs=1, under=d)
            assert not os.path.exists(f"{root}/iter_0000100") and os.path.exists(f"{root}/iter_0000300"), name
            shutil.rmtree(root)
        table(f"prune: 3 checkpoints x {shards} shards, keep the newest, {delay_ms} ms per metadata call", res)
    finally:
        shutil.rmtree(d)


def publish(shards: int, delay_ms: float) -> None:
    """publish of one checkpoint of N shards into a run root, against a plain durable copy (cp -r
    with an fsync per file) through the same layer, serially and with publish's copy parallelism."""
    d = tempfile.mkdtemp(prefix="ckd-lat-publish-")
    try:
        src = os.path.join(d, "src")
        files = build_run_root(src, 1, shards)
        ck = f"{src}/iter_0000100"
        res = {}
        for name, args, env in (
                ("plain durable copy, serial", ["--plain-cp", "--threads", "1", "--"], None),
                ("plain durable copy, 16 threads", ["--plain-cp", "--threads", "16", "--"], None),
                ("ckptdoctor publish, serial (--workers 1, CKPTDOCTOR_IO_THREADS=1)",
                 ["--", "publish", "-q", "--tracker", "none", "--workers", "1"], {"CKPTDOCTOR_IO_THREADS": "1"}),
                ("ckptdoctor publish, default", ["--", "publish", "-q", "--tracker", "none"], None)):
            dst = os.path.join(d, "dst")
            os.makedirs(dst)
            tail = [ck, f"{dst}/iter_0000100"] if args[0] == "--plain-cp" else [ck, dst]
            res[name] = layered([*args, *tail], delay_ms, files, env=env, runs=1, under=d)
            assert os.path.isfile(f"{dst}/iter_0000100/metadata.json"), (name, res[name])
            shutil.rmtree(dst)
        table(f"publish: 1 checkpoint x {shards} shards into a run root, {delay_ms} ms per metadata call", res)
    finally:
        shutil.rmtree(d)


READ_DELAY_MS = 0.0   # --read-delay-ms: data reads charged too (delayed.py), 0 = metadata calls only


def main() -> None:
    global READ_DELAY_MS
    args = sys.argv[1:]
    READ_DELAY_MS = float(args[args.index("--read-delay-ms") + 1]) if "--read-delay-ms" in args else 0.0
    shards = int(args[args.index("--shards") + 1]) if "--shards" in args else 4096
    delay = float(args[args.index("--delay-ms") + 1]) if "--delay-ms" in args else None
    which = next((a for a in args if a in ("posix", "fuse", "s3", "preflight", "prune", "publish", "all")), "all")
    from common import compile_package
    compile_package()  # as an install leaves it: every run not paying to compile 60 modules (~0.15 s)
    if which in ("posix", "all"):
        posix(shards, delay if delay is not None else 2.0)
    if which in ("fuse", "all"):
        fuse(shards, delay if delay is not None else 2.0)
    if which in ("s3", "all"):
        s3(shards, delay if delay is not None else 20.0)
    if which in ("preflight", "all"):
        preflight(delay if delay is not None else 2.0)
    if which in ("prune", "all"):
        prune(shards, delay if delay is not None else 2.0)
    if which in ("publish", "all"):
        publish(shards, delay if delay is not None else 2.0)


def build_node_views(root: str, nodes: int, per_node: int) -> tuple[str, int]:
    """One checkpoint of nodes x per_node shards, spread the way node-local saving leaves it: each
    node's directory holds its own ranks' shards plus the global files (hard links: no copies)."""
    from ckptdoctor.layouts import dcp_writer as W
    world = nodes * per_node
    src = os.path.join(root, "src", "iter_0000100")
    W.write(src, [W.Item("w", (world, 1), (r, 0), (1, 1), [1.0], rank=r) for r in range(world)])
    open(f"{src}/metadata.json", "w").write('{"sharded_backend": "torch_dist"}')
    files = 0
    for i in range(nodes):
        d = os.path.join(root, f"n{i:04d}", "run7", "iter_0000100")
        os.makedirs(d)
        for f in os.listdir(src):
            if f.startswith("__") and int(f[2:].split("_")[0]) // per_node != i:
                continue
            os.link(os.path.join(src, f), os.path.join(d, f))
            files += 1
        open(os.path.join(root, f"n{i:04d}", "run7", "latest_checkpointed_iteration.txt"), "w").write("100")
        files += 1
    return os.path.join(root, "{node}", "run7"), files


def preflight(delay_ms: float, nodes: int = 512, per_node: int = 8) -> None:
    d = tempfile.mkdtemp(prefix="ckd-lat-pf-")
    try:
        loc, files = build_node_views(d, nodes, per_node)
        args = ["--", "preflight", "-q", "--nodelist", f"n[0000-{nodes - 1:04d}]", "--ranks-per-node",
                str(per_node), loc]
        res = {"ckptdoctor preflight, serial (CKPTDOCTOR_IO_THREADS=1)":
               layered(args, delay_ms, files, env={"CKPTDOCTOR_IO_THREADS": "1"}, runs=1, under=d),
               "ckptdoctor preflight, default": layered(args, delay_ms, files, under=d),
               "ckptdoctor preflight, no delay": layered(args, 0.0, files, under=d)}
        table(f"preflight: {nodes} node views x {per_node} ranks ({files} files), {delay_ms} ms per metadata call", res)
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
