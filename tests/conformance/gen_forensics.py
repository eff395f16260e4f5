"""Generator: real failure logs of real loads and saves, for `ckptdoctor forensics`.

    python tests/conformance/gen_forensics.py [--out tests/fixtures/real/forensics] [--only NAME]
        [--ds-python /venv/bin/python] [--hf-python /venv/bin/python]

Every case runs the real library on a damaged checkpoint (or a full disk, or an address-space limit)
the way a job does: torchrun over gloo with 2-4 ranks, or one process, all output to one file as a
Slurm output file holds it (`job.log`; one case keeps torchrun's per-rank `--log-dir` files instead,
one is gzipped).  The truth is what the generator did (which file it damaged, which rank it killed,
which limit it set; `ranks` are the ranks that raised the cause themselves, empty for a job of one
process that names no rank) and is checked against what the library printed before it is written: the
exception the cause must show, the ranks that raised it, the ranks that only failed after.  The
damaged checkpoint is kept beside the log (`run/`) so `--run-root` can be tested on it.

DeepSpeed and Trainer cases need their libraries (the `conformance` extra, or venvs given with
--ds-python / --hf-python); torch's cases run on the torch this script runs on.  Paths in the logs
are under /tmp/ckd-forensics/<case>/ (the log is from another machine, as logs usually are).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "forensics_worker.py")
BASE = "/tmp/ckd-forensics"
sys.path.insert(0, HERE)
import damage  # noqa: E402


def cases() -> list[dict]:
    """name, what runs, how the checkpoint is made and damaged, and the truth (`exception` is the cause,
    not the last exception: megatron-core 0.16 hides a missing common.pt behind an AttributeError raised
    while handling it; `exception` None where
    the real library varies between runs: a full disk is OSError ENOSPC on one rank and torch's
    "unexpected pos" RuntimeError on another, whichever write hits it)."""
    return [
        {"name": "dcp-shard-missing", "nproc": 4, "mode": "dcp-load", "make": "dcp", "ckpt": "run/step-200",
         "ops": [["delete", "run/step-200/__2_0.distcp"]],
         "truth": {"class": "file", "exception": "FileNotFoundError", "file": "run/step-200/__2_0.distcp",
                   "errno": "ENOENT", "ranks": [0, 1, 2, 3], "after": []}},
        {"name": "dcp-shard-missing-logdir", "nproc": 4, "mode": "dcp-load", "make": "dcp", "ckpt": "run/step-200",
         "ops": [["delete", "run/step-200/__1_0.distcp"]], "logdir": True,
         "truth": {"class": "file", "exception": "FileNotFoundError", "file": "run/step-200/__1_0.distcp",
                   "errno": "ENOENT", "ranks": [0, 1, 2, 3], "after": []}},
        {"name": "dcp-shard-truncated", "nproc": 2, "mode": "dcp-load", "make": "dcp", "ckpt": "run/step-200",
         "ops": [["truncate", "run/step-200/__1_0.distcp"]], "gzip": True,
         "truth": {"class": "file", "exception": "EOFError", "file": "run/step-200", "errno": None,
                   "ranks": [0, 1], "after": [], "finding_file": "run/step-200/__1_0.distcp"}},
        {"name": "dcp-metadata-missing", "nproc": 2, "mode": "dcp-load", "make": "dcp", "ckpt": "run/step-200",
         "ops": [["delete", "run/step-200/.metadata"]],
         "truth": {"class": "file", "exception": "AssertionError", "file": "run/step-200/.metadata", "errno": "ENOENT",
                   "ranks": [0, 1], "after": []}},
        {"name": "dcp-resume-forgot-step", "nproc": 2, "mode": "dcp-resume-forgot", "make": "dcp-digests",
         "ckpt": "run/step-200", "ops": [],
         "truth": {"class": "derived-state", "exception": "ResumeMismatch", "file": "run/step-200", "errno": None,
                   "ranks": [0, 1], "after": [], "broken": False}},
        {"name": "dcp-rank-killed", "nproc": 2, "mode": "dcp-load-killed", "make": "dcp", "ckpt": "run/step-200",
         "ops": [],
         "truth": {"class": "memory", "exception": "SIGKILL", "file": None, "errno": None, "ranks": [1],
                   "after": [0]}},
        {"name": "dcp-save-enospc", "nproc": 2, "mode": "dcp-save-big", "make": "tmpfs", "ckpt": "run/step-300",
         "ops": [],
         "truth": {"class": "file", "exception": None, "file": "run/step-300", "errno": "ENOSPC",
                   "ranks": [0, 1], "after": []}},
        {"name": "torch-load-truncated", "nproc": None, "mode": "torch-load", "make": "pt", "ckpt": "run/model.pt",
         "ops": [["truncate", "run/model.pt"]],
         "truth": {"class": "file", "exception": "RuntimeError", "file": "run/model.pt", "errno": None,
                   "ranks": [], "after": []}},
        {"name": "torch-load-as-limit", "nproc": None, "mode": "torch-load-as-limit", "make": "pt-big",
         "ckpt": "run/model.pt", "ops": [],
         "truth": {"class": "memory", "exception": "RuntimeError", "file": "run/model.pt", "errno": "ENOMEM",
                   "ranks": [], "after": []}},
        {"name": "deepspeed-optim-missing", "nproc": 2, "mode": "ds-load", "make": "ds", "ckpt": "run", "tasks": True,
         "python": "ds", "ops": [["delete", "run/global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt"]],
         "truth": {"class": "file", "exception": "FileNotFoundError",
                   "file": "run/global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt", "errno": "ENOENT",
                   "ranks": [1], "after": [0]}},
        {"name": "megatron-common-missing", "nproc": 2, "mode": "mc-load", "make": "megatron", "ckpt": "run",
         "python": "mc", "ops": [["delete", "run/iter_0000002/common.pt"]],
         "truth": {"class": "file", "exception": "FileNotFoundError", "file": "run/iter_0000002/common.pt",
                   "errno": "ENOENT", "ranks": [0, 1], "after": []}},
        {"name": "megatron-metadata-json-missing", "nproc": 2, "mode": "mc-load", "make": "megatron", "ckpt": "run",
         "python": "mc", "ops": [["delete", "run/iter_0000002/metadata.json"]],
         "truth": {"class": "file", "exception": "CheckpointingException", "file": "run/iter_0000002",
                   "errno": None, "ranks": [0, 1], "after": []}},
        {"name": "trainer-weights-truncated", "nproc": None, "mode": "trainer-resume", "make": "trainer",
         "ckpt": "run", "python": "hf", "ops": [["truncate", "run/checkpoint-4/model.safetensors"]],
         "truth": {"class": "file", "exception": "SafetensorError", "file": "run/checkpoint-4",
                   "errno": None, "ranks": [], "after": [], "finding_file": "run/checkpoint-4/model.safetensors"}},
    ]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tasks(py: str, case: dict, where: str, env: dict) -> int:
    """Each rank its own process and its own output file, as `srun -o task-%t.out` starts them: no
    launcher kills the others when one fails, so they wait in their next collective."""
    port, procs = _port(), []
    for r in range(case["nproc"]):
        out = open(os.path.join(where, f"task-{r}.out"), "w")
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(case["nproc"]),
                 LOCAL_WORLD_SIZE=str(case["nproc"]), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([py, WORKER, case["mode"], os.path.join(where, case["ckpt"])], env=e,
                                      stdout=out, stderr=subprocess.STDOUT, cwd=where))
    return max(abs(p.wait(timeout=600)) for p in procs)


def launch(py: str, case: dict, where: str, log) -> int:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu",
               FORENSICS_TIMEOUT="15", PYTHONUNBUFFERED="1", TRANSFORMERS_VERBOSITY="info")
    if case.get("tasks"):
        return tasks(py, case, where, env)
    ckpt = os.path.join(where, case["ckpt"])
    if case["nproc"]:
        cmd = [py, "-m", "torch.distributed.run", "--nproc-per-node", str(case["nproc"]),
               "--master-port", str(_port())]
        if case.get("logdir"):
            cmd += ["--log-dir", os.path.join(where, "logs"), "--tee", "3"]
        cmd += [WORKER, case["mode"], ckpt]
    else:
        cmd = [py, WORKER, case["mode"], ckpt]
    return subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=600, cwd=where).returncode


def make(py: str, case: dict, where: str, fixtures: str) -> None:
    run = os.path.join(where, "run")
    if case["make"] in ("dcp", "dcp-digests"):
        save = "dcp-save-digests" if case["make"] == "dcp-digests" else "dcp-save"
        with open(os.devnull, "w") as null:
            assert launch(py, dict(case, mode=save, logdir=False), where, null) == 0, "healthy save failed"
    elif case["make"] == "tmpfs":   # a 1 MiB filesystem: the 4 MiB-per-rank save hits ENOSPC
        os.makedirs(run)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", run], check=True)
    elif case["make"] in ("pt", "pt-big"):
        import torch
        os.makedirs(run)
        n = 64 * 1024 * 1024 if case["make"] == "pt-big" else 64 * 1024
        torch.save({"w": torch.arange(n, dtype=torch.float32)}, os.path.join(run, "model.pt"))
    elif case["make"] == "ds":
        shutil.copytree(os.path.join(fixtures, "..", "deepspeed", "zero2"), run,
                        ignore=shutil.ignore_patterns("zero_to_*.py"))   # DeepSpeed's helper scripts: not read
    elif case["make"] == "megatron":
        shutil.copytree(os.path.join(fixtures, "..", "megatron-core", "torch_dist"), run)
    elif case["make"] == "trainer":
        shutil.copytree(os.path.join(fixtures, "..", "transformers", "trainer"), run)
    damage.apply(where, case["ops"])


def generate(case: dict, out: str, pythons: dict) -> dict:
    where = os.path.join(BASE, case["name"])
    if os.path.ismount(os.path.join(where, "run")):
        subprocess.run(["umount", os.path.join(where, "run")], check=True)
    shutil.rmtree(where, ignore_errors=True)
    os.makedirs(where)
    py = pythons[case.get("python", "torch")]
    make(py, case, where, out)
    with open(os.path.join(where, "job.log"), "w") as log:
        rc = launch(py, case, where, log)
    if os.path.ismount(os.path.join(where, "run")):
        subprocess.run(["umount", os.path.join(where, "run")], check=True)
    dest = os.path.join(out, case["name"])
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    logs = []
    if case.get("tasks"):
        for r in range(case["nproc"]):
            shutil.copy(os.path.join(where, f"task-{r}.out"), os.path.join(dest, f"task-{r}.out"))
            logs.append(f"task-{r}.out")
    elif case.get("logdir"):        # torchrun's own per-rank files, not the job's output
        for r in range(case["nproc"]):
            src = next(os.path.join(d, "stderr.log") for d, _, fs in os.walk(os.path.join(where, "logs"))
                       if "stderr.log" in fs and os.path.basename(d) == str(r))
            shutil.copy(src, os.path.join(dest, f"rank{r}.stderr.log"))
            logs.append(f"rank{r}.stderr.log")
    elif case.get("gzip"):
        with open(os.path.join(where, "job.log"), "rb") as src, open(os.path.join(dest, "job.log.gz"), "wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as dst:
                shutil.copyfileobj(src, dst)
        logs.append("job.log.gz")
    else:
        shutil.copy(os.path.join(where, "job.log"), os.path.join(dest, "job.log"))
        logs.append("job.log")
    if os.path.isdir(os.path.join(where, "run")) and case["make"] not in ("pt-big", "tmpfs"):
        shutil.copytree(os.path.join(where, "run"), os.path.join(dest, "run"), symlinks=True)
    text = "".join(open(os.path.join(dest, n), errors="replace").read() for n in logs if not n.endswith(".gz"))
    text += open(os.path.join(where, "job.log"), errors="replace").read()
    exc = case["truth"]["exception"]
    assert rc != 0, f"{case['name']}: the job did not fail"
    assert exc is None or exc == "SIGKILL" or exc in text, f"{case['name']}: {exc} not in the log"
    return {"logs": logs, "exit_status": rc, "ops": case["ops"], "mode": case["mode"], "nproc": case["nproc"],
            "base": where, "truth": case["truth"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "..", "fixtures", "real", "forensics"))
    ap.add_argument("--only")
    ap.add_argument("--ds-python"), ap.add_argument("--hf-python"), ap.add_argument("--mc-python")
    args = ap.parse_args()
    import torch
    pythons = {"torch": sys.executable, "ds": args.ds_python or sys.executable, "hf": args.hf_python or sys.executable,
               "mc": args.mc_python or sys.executable}
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "cases.json")
    doc = json.load(open(path)) if os.path.exists(path) else {"cases": {}}
    doc.update(generator="tests/conformance/gen_forensics.py", torch=torch.__version__.split("+")[0])
    for case in cases():
        if args.only and case["name"] != args.only:
            continue
        rec = generate(case, out, pythons)
        for key, lib, mod in (("ds", "deepspeed", "deepspeed"), ("hf", "transformers", "transformers"),
                              ("mc", "megatron-core", "megatron.core")):
            if case.get("python") == key:
                rec["library"] = lib + "==" + subprocess.run(
                    [pythons[key], "-c", f"import {mod}; print({mod}.__version__)"], capture_output=True,
                    text=True, env=dict(os.environ, DS_ACCELERATOR="cpu")).stdout.strip().splitlines()[-1]
        doc["cases"][case["name"]] = rec
        print(f"{case['name']}: exit {rec['exit_status']}", flush=True)
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.write("\n")


if __name__ == "__main__":
    main()
