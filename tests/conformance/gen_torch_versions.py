"""Generator: which torch can load a DCP checkpoint another torch wrote (issue 35).

    python tests/conformance/gen_torch_versions.py --python 2.3.1=/venvs/t23/bin/python \
        --python 2.13.0=.venv/bin/python ... [--out tests/fixtures/real/torch-versions]

For every writer version W: `dcp.save` of a small state dict (tensors, a nested dict, an int) in one
process, and of a DTensor-sharded state dict by 2 gloo ranks.  For every reader version R: `dcp.load`
of each into a fresh state dict of the same shapes (2 gloo ranks for the sharded one), comparing the
tensors (and saying whether non-tensor values such as the step were restored in place).  Records `loads` or the exception, per (W, R, kind), and the healthy checkpoints each W
wrote (`<W>/<kind>/`, a few KB) so the suite can check what `verify` says about each.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

WORKER = r'''
import os, sys, json, warnings
warnings.filterwarnings("ignore")
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
mode, kind, path, out = sys.argv[1:5]
def plain(fill):
    return {"model": {"w": torch.full((4, 3), fill), "b": torch.full((3,), fill)}, "step": 7 if fill else 0,
            "extra": {"note": "hi" if fill else "", "lr": 0.1 if fill else 0.0}}
def sharded(fill):
    try:
        from torch.distributed.tensor import DTensor, Shard, init_device_mesh
    except ImportError:
        from torch.distributed._tensor import DTensor, Shard, init_device_mesh
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    r = dist.get_rank()
    return {"w": DTensor.from_local(torch.full((2, 3), fill + r), mesh, [Shard(0)]), "step": 7 if fill else 0}
import inspect
def call(new, old, sd, **kw):   # torch 2.3: dcp.load/save take no no_dist; *_state_dict do
    fn = new if "no_dist" in inspect.signature(new).parameters else old
    fn(sd, no_dist=True, **kw)
res = {}
try:
    if kind == "sharded":
        dist.init_process_group("gloo")
    if mode == "save":
        sd = plain(1.0) if kind == "plain" else sharded(1.0)
        if kind == "plain":
            call(dcp.save, dcp.save_state_dict, sd, storage_writer=dcp.FileSystemWriter(path))
        else:
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(path))
        res["ok"] = True
    else:
        sd = plain(0.0) if kind == "plain" else sharded(0.0)
        if kind == "plain":
            call(dcp.load, dcp.load_state_dict, sd, storage_reader=dcp.FileSystemReader(path))
            good = bool((sd["model"]["w"] == 1.0).all())
            res["non_tensors_restored"] = sd["step"] == 7 and sd["extra"]["note"] == "hi"
        else:
            dcp.load(sd, storage_reader=dcp.FileSystemReader(path))
            good = bool((sd["w"].to_local() == 1.0 + dist.get_rank()).all())
            res["non_tensors_restored"] = sd["step"] == 7
        res["ok"] = good
        if not good:
            res["error"] = "loaded different values"
except BaseException as exc:
    res["ok"] = False
    res["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}"
if kind != "sharded" or dist.get_rank() == 0:
    json.dump(res, open(out, "w"))
'''


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(py: str, mode: str, kind: str, path: str) -> dict:
    with tempfile.TemporaryDirectory() as t:
        w, out = os.path.join(t, "w.py"), os.path.join(t, "r.json")
        open(w, "w").write(WORKER)
        env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
        if kind == "sharded":
            cmd = [py, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_port()),
                   w, mode, kind, path, out]
        else:
            cmd = [py, w, mode, kind, path, out]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        try:
            return json.load(open(out))
        except (OSError, ValueError):
            return {"ok": False, "error": f"no result (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", action="append", required=True, help="VERSION=PYTHON")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "fixtures", "real", "torch-versions"))
    args = ap.parse_args()
    pys = dict(p.split("=", 1) for p in args.python)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    doc = {"generator": "tests/conformance/gen_torch_versions.py", "versions": sorted(pys, key=_key), "loads": {}}
    for wv, wpy in sorted(pys.items(), key=lambda kv: _key(kv[0])):
        for kind in ("plain", "sharded"):
            dest = os.path.join(out, wv, kind)
            shutil.rmtree(dest, ignore_errors=True)
            saved = run(wpy, "save", kind, dest)
            assert saved.get("ok"), (wv, kind, saved)
            for rv, rpy in sorted(pys.items(), key=lambda kv: _key(kv[0])):
                with tempfile.TemporaryDirectory() as t:
                    copy = shutil.copytree(dest, os.path.join(t, "c"))
                    got = run(rpy, "load", kind, copy)
                doc["loads"][f"{wv} -> {rv} {kind}"] = ("loads" + ("" if got.get("non_tensors_restored") else
                                                                   " (tensors only: non-tensor values not restored)")
                                                        if got.get("ok") else got.get("error", "?"))
                print(f"{wv} -> {rv} {kind}: {doc['loads'][f'{wv} -> {rv} {kind}']}", flush=True)
    with open(os.path.join(out, "loads.json"), "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.write("\n")


def _key(v: str):
    return tuple(int(x) for x in v.split("."))


if __name__ == "__main__":
    main()
