"""Generator: DeepSpeed checkpoints written by DeepSpeed itself, damaged, and labelled by its own load.

    DS_ACCELERATOR=cpu python tests/conformance/gen_deepspeed.py [--out tests/fixtures/real/deepspeed]

Needs the `conformance` extra (deepspeed, torch; CPU and gloo are enough).  For each ZeRO stage 1, 2
and 3 it trains a tiny model on 2 gloo ranks for 2 steps, saving after each with
`engine.save_checkpoint(root)` (DeepSpeed's own tag, `global_step{N}`, and its own `latest`), then
for every case of the damage matrix (tests/conformance/damage.py) copies the run root, damages it,
starts 2 fresh ranks that build the same engine and call `engine.load_checkpoint(root)`, and records
what the real load did:

  loads               every rank returned the tag `latest` names, with the weights saved at that tag
  raises              a rank raised (the exception type and text are recorded per rank)
  hangs               a rank was still running after --timeout s (e.g. rank 1 raised, rank 0 waits in a collective)
  silent-fresh-start  load_checkpoint returned (None, None): training would restart from scratch
  wrong-state         loaded, but not the weights saved at that tag

The healthy run roots and `outcomes.json` (stamped with the deepspeed and torch versions) are what the
suite reads (tests/test_conformance.py); it never imports deepspeed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import damage  # noqa: E402

WORLD = 2


def cases(stage: int) -> list[dict]:
    """(name, ops, the file a correct verdict must name or None for a healthy case)."""
    s2 = "global_step2"
    model = f"{s2}/zero_pp_rank_0_mp_rank_00_model_states.pt" if stage == 3 else f"{s2}/mp_rank_00_model_states.pt"
    optim1 = f"{s2}/zero_pp_rank_1_mp_rank_00_optim_states.pt"
    out = [
        {"name": "healthy", "ops": [], "names": None},
        {"name": "model-truncated", "ops": [["truncate", model]], "names": model},
        {"name": "optim-truncated", "ops": [["truncate", f"{s2}/zero_pp_rank_0_mp_rank_00_optim_states.pt"]],
         "names": f"{s2}/zero_pp_rank_0_mp_rank_00_optim_states.pt"},
        {"name": "rank1-optim-missing", "ops": [["delete", optim1]], "names": optim1},
        {"name": "latest-names-model-only-step", "ops": [["delete_glob", s2, "*optim_states.pt"]],
         "names": "optim_states.pt"},
        {"name": "latest-names-missing-dir", "ops": [["write", "latest", "global_step9"]], "names": "latest"},
        {"name": "latest-deleted", "ops": [["delete", "latest"]], "names": "latest"},
        {"name": "latest-empty", "ops": [["write", "latest", ""]], "names": "latest"},
        {"name": "killed-newer-save", "ops": [["copy_partial", s2, "global_step3", "*model_states.pt"]],
         "names": None},
        {"name": "tracker-at-older-complete-step", "ops": [["write", "latest", "global_step1"]], "names": None},
    ]
    if stage == 3:
        m1 = f"{s2}/zero_pp_rank_1_mp_rank_00_model_states.pt"
        out.append({"name": "rank1-model-missing", "ops": [["delete", m1]], "names": m1})
    # a file the job's user may not read (another user's umask, a copy that kept modes)
    out += [{"name": f"{name}-unreadable", "ops": [["unreadable", f]], "names": f}
            for name, f in (("model", model), ("rank1-optim", optim1), ("latest", "latest"))]
    return out


# ---- the real library, in worker processes -------------------------------------------------------

def _engine(stage: int):
    import deepspeed
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.01, "warmup_num_steps": 10}}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    return engine


def _fingerprint(engine) -> float:
    import deepspeed
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params):
        return float(sum(p.detach().double().sum() for p in params))


def worker(args) -> None:
    import datetime
    import deepspeed
    import torch
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port), RANK=str(args.rank),
                      WORLD_SIZE=str(WORLD), LOCAL_RANK=str(args.rank), LOCAL_WORLD_SIZE=str(WORLD))
    deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=args.timeout * 4))
    engine = _engine(args.stage)
    result: dict = {"rank": args.rank}
    if args.mode == "save":
        prints = {}
        for step in (1, 2):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step + args.rank))
            loss = engine(x).pow(2).sum()
            engine.backward(loss)
            engine.step()
            engine.save_checkpoint(args.root)
            prints[f"global_step{engine.global_steps}"] = _fingerprint(engine)
        result["fingerprints"] = prints
    else:
        try:
            path, client = engine.load_checkpoint(args.root)
            result["load_path"] = path
            result["fingerprint"] = _fingerprint(engine) if path is not None else None
        except BaseException as exc:  # noqa: BLE001 - what the real load raised is the label
            result["raised"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    with open(args.result, "w") as fh:
        json.dump(result, fh)
    if "raised" in result:
        os._exit(1)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks_cmd(script: str, mode: str, extra: list[str], root: str, timeout: float, prefix: list | None = None):
    """Start WORLD ranks of `script --worker MODE` on a fresh gloo port; (per-rank results, hung?).
    A rank still running after `timeout` s is killed (with its process group) and counts as hung.
    `prefix`: a command to run each rank under (`damage.unprivileged(ops)`)."""
    port, tmp = _port(), tempfile.mkdtemp()
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    procs = []
    for r in range(WORLD):
        res = os.path.join(tmp, f"r{r}.json")
        cmd = [*(prefix or []), sys.executable, script, "--worker", mode, *extra, "--root", root,
               "--rank", str(r), "--port", str(port), "--result", res, "--timeout", str(timeout)]
        procs.append((subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       start_new_session=True), res))
    deadline, hung = time.monotonic() + timeout, False
    for p, _ in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung = True
    for p, _ in procs:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    out = []
    for _, res in procs:
        try:
            with open(res) as fh:
                out.append(json.load(fh))
        except (OSError, ValueError):
            out.append(None)
    shutil.rmtree(tmp, ignore_errors=True)
    return out, hung


def run_ranks(mode: str, stage: int, root: str, timeout: float, prefix: list | None = None):
    return run_ranks_cmd(__file__, mode, ["--stage", str(stage)], root, timeout, prefix)


def label(results: list[dict | None], hung: bool, want: float | None, tag: str | None) -> tuple[str, list]:
    detail = [r.get("raised") if r else "no result (killed or hung)" for r in results]
    if any(r and "raised" in r for r in results):
        return ("hangs" if hung else "raises"), detail
    if hung or any(r is None for r in results):
        return "hangs", detail
    if all(r.get("load_path") is None for r in results):
        return "silent-fresh-start", detail
    # load_checkpoint returns the model-states file it read: its directory is the tag
    loaded = {os.path.basename(os.path.dirname(os.path.normpath(r["load_path"]))) for r in results}
    if want is None or loaded != {tag} or any(abs(r["fingerprint"] - want) > 1e-6 for r in results):
        return "wrong-state", [f"loaded {sorted(loaded)}"]
    return "loads", detail


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "..", "fixtures", "real", "deepspeed"))
    ap.add_argument("--timeout", type=float, default=90.0)
    ap.add_argument("--stages", default="1,2,3")
    ap.add_argument("--worker"), ap.add_argument("--stage", type=int), ap.add_argument("--root")
    ap.add_argument("--rank", type=int), ap.add_argument("--port", type=int), ap.add_argument("--result")
    ap.add_argument("--cases", help="comma-separated case names: label only these on the committed fixtures "
                    "(what each healthy load returns is the reference) and merge them into outcomes.json")
    args = ap.parse_args()
    if args.worker:
        args.mode = args.worker
        return worker(args)
    import deepspeed
    import torch
    if args.cases:
        return relabel(args, deepspeed.__version__)
    os.makedirs(args.out, exist_ok=True)
    doc = {"library": "deepspeed", "version": deepspeed.__version__, "torch": torch.__version__.split("+")[0],
           "generator": "tests/conformance/gen_deepspeed.py", "world_size": WORLD, "stages": {}}
    for stage in map(int, args.stages.split(",")):
        healthy = os.path.join(args.out, f"zero{stage}")
        shutil.rmtree(healthy, ignore_errors=True)
        res, hung = run_ranks("save", stage, healthy, args.timeout)
        assert not hung and all(r and "fingerprints" in r for r in res), res
        prints = res[0]["fingerprints"]
        st = doc["stages"][str(stage)] = {"root": f"zero{stage}", "cases": {}}
        for case in cases(stage):
            _label_case(st, stage, healthy, case, prints, args.timeout)
    damage.write_outcomes(args.out, doc)


def _label_case(st: dict, stage: int, healthy: str, case: dict, prints: dict, timeout: float) -> None:
    with tempfile.TemporaryDirectory() as t:
        root = damage.copy_and_apply(healthy, os.path.join(t, "run"), case["ops"])
        try:
            with open(os.path.join(root, "latest")) as fh:
                tag = fh.read().strip()
        except OSError:
            tag = None
        res, hung = run_ranks("load", stage, root, timeout, damage.unprivileged(case["ops"]))
        outcome, detail = label(res, hung, prints.get(tag), tag)
        detail = [d.replace(root, "<root>") if isinstance(d, str) else d for d in detail]
    st["cases"][case["name"]] = {"ops": case["ops"], "names": case["names"], "outcome": outcome, "detail": detail}
    print(f"zero{stage} {case['name']}: {outcome} {detail}", flush=True)


def relabel(args, version: str) -> None:
    """`--cases`: the named cases on the committed fixtures, merged into outcomes.json; the reference
    state is what the undamaged fixture's own load returns at the step `latest` names."""
    with open(os.path.join(args.out, "outcomes.json")) as fh:
        doc = json.load(fh)
    assert doc["version"] == version, f"the fixtures were made with deepspeed {doc['version']}, this is {version}"
    want = args.cases.split(",")
    for stage in map(int, args.stages.split(",")):
        healthy = os.path.join(args.out, f"zero{stage}")
        with tempfile.TemporaryDirectory() as t:
            res, hung = run_ranks("load", stage, damage.copy_and_apply(healthy, os.path.join(t, "run"), []),
                                  args.timeout)
        assert not hung and all(r and r.get("load_path") for r in res), res
        tag = os.path.basename(os.path.dirname(os.path.normpath(res[0]["load_path"])))
        prints = {tag: res[0]["fingerprint"]}
        for case in cases(stage):
            if case["name"] in want:
                _label_case(doc["stages"][str(stage)], stage, healthy, case, prints, args.timeout)
    damage.write_outcomes(args.out, doc)


if __name__ == "__main__":
    main()
