"""Generator: Megatron-Core torch_dist checkpoints written by megatron-core, damaged, labelled by its load.

    python tests/conformance/gen_megatron.py [--out tests/fixtures/real/megatron-core]

Needs the `conformance` extra (megatron-core, torch).  On 2 gloo ranks it saves, with
`dist_checkpointing.save` (the torch_dist backend), a state dict shaped like a TP=2 model: a tensor
split on dim 0 and one on dim 1 (each rank writes its shard), a replicated tensor, a per-rank RNG
ShardedObject (`rng_state/shard_0.{r}_1.2`) and common state (`iteration`), into `iter_0000001/` and
`iter_0000002/` of a run root, and writes `latest_checkpointed_iteration.txt` after each as
Megatron-LM's save_checkpoint does.  For each damage case 2 fresh ranks read the tracker the way
Megatron-LM does (`int(text.strip())`), call `dist_checkpointing.load` on that iteration and compare
every value with what was saved:

  loads        every rank got back exactly what was saved at that iteration
  raises       a rank raised (type and text recorded)
  hangs        a rank was still running after --timeout s
  wrong-state  loaded, with other values

CPU shim (generator only, never in ckptdoctor): megatron-core 0.16's torch_dist save calls
`torch.cuda.synchronize()` and `torch.cuda.current_device()` unconditionally; on a CPU-only torch both
raise, so synchronize becomes a no-op and current_device answers "cpu" (it is only used as the
device of a 1-element failure flag broadcast over gloo).  Loading needs neither.  psutil must be
installed beside megatron-core (its async writer imports it on use).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import damage  # noqa: E402
from gen_deepspeed import WORLD, run_ranks_cmd  # noqa: E402

TRACKER = "latest_checkpointed_iteration.txt"


def cases() -> list[dict]:
    i2 = "iter_0000002"
    return [
        {"name": "healthy", "ops": [], "names": None},
        {"name": "common-pt-missing", "ops": [["delete", f"{i2}/common.pt"]], "names": f"{i2}/common.pt"},
        {"name": "common-pt-truncated", "ops": [["truncate", f"{i2}/common.pt"]], "names": f"{i2}/common.pt"},
        {"name": "metadata-json-missing", "ops": [["delete", f"{i2}/metadata.json"]], "names": i2},
        {"name": "dcp-metadata-missing", "ops": [["delete", f"{i2}/.metadata"]], "names": i2},
        {"name": "rank1-shard-missing", "ops": [["delete_glob", i2, "__1_*.distcp"]], "names": "__1_"},
        {"name": "shard-truncated", "ops": [["truncate", f"{i2}/__0_0.distcp"]], "names": f"{i2}/__0_0.distcp"},
        {"name": "tracker-names-missing-iteration", "ops": [["write", TRACKER, "3"]], "names": TRACKER},
        {"name": "killed-newer-save", "ops": [["copy_partial", i2, "iter_0000003", "__*.distcp"]], "names": None},
        {"name": "tracker-at-older-complete-iteration", "ops": [["write", TRACKER, "1"]], "names": None},
        # metadata.json is parsed by every rank's load (core.maybe_load_config: json.load, then
        # CheckpointingConfig(**doc)): its content, not only its presence, decides the load
        {"name": "metadata-json-truncated", "ops": [["truncate", f"{i2}/metadata.json"]],
         "names": f"{i2}/metadata.json"},
        {"name": "metadata-json-not-an-object", "ops": [["write", f"{i2}/metadata.json", "[]"]],
         "names": f"{i2}/metadata.json"},
        # a file the job's user may not read (another user's umask, a copy that kept modes)
        *({"name": f"{name}-unreadable", "ops": [["unreadable", f"{i2}/{f}"]], "names": f"{i2}/{f}"} for name, f in (
            ("metadata-json", "metadata.json"), ("common-pt", "common.pt"), ("dcp-metadata", ".metadata"),
            ("shard", "__0_0.distcp"))),
        {"name": "metadata-json-unknown-field", "ops": [["write", f"{i2}/metadata.json",
                                                         '{"sharded_backend": "torch_dist", "format": 2}']],
         "names": f"{i2}/metadata.json"},
        {"name": "metadata-json-without-common-backend", "ops": [["write", f"{i2}/metadata.json",
                                                                  '{"sharded_backend": "torch_dist"}']],
         "names": None},
    ]


NODES = ["n0", "n1"]      # one rank per node: rank r runs on NODES[r] and reads only that node's copy


def splits() -> list[dict]:
    """Node-local layouts of the healthy run for preflight (issue 36): which files of the tracker's
    iteration each node holds.  Every node keeps the tracker and the other iteration; `ops` per node."""
    i2 = "iter_0000002"
    files = ["__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "__1_1.distcp", ".metadata", "metadata.json", "common.pt"]
    out = [{"name": "full", "ops": {n: [] for n in NODES}},
           {"name": "own-shards", "ops": {n: [["delete_glob", i2, f"__{1 - r}_*.distcp"]] for r, n in enumerate(NODES)}}]
    for n in NODES:
        for f in files:
            out.append({"name": f"{n}-without-{f}", "ops": {m: [["delete", f"{i2}/{f}"]] if m == n else [] for m in NODES}})
    return out


def _cpu_shim() -> None:
    import torch
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"   # used as device= of a tensor broadcast over gloo


def _state(rank: int, it: int, empty: bool):
    import torch
    from megatron.core.dist_checkpointing import ShardedObject, ShardedTensor
    g = torch.Generator().manual_seed(100 * it + rank)

    def t(*shape):
        return torch.zeros(*shape) if empty else torch.randn(*shape, generator=g)
    rep = torch.zeros(3) if empty else torch.arange(3.0) + it
    return {
        "fc1.weight": ShardedTensor.from_rank_offsets("fc1.weight", t(4, 6), (0, rank, WORLD)),
        "fc2.weight": ShardedTensor.from_rank_offsets("fc2.weight", t(6, 4), (1, rank, WORLD)),
        "norm.weight": ShardedTensor.from_rank_offsets("norm.weight", rep, replica_id=rank),
        "rng_state": ShardedObject("rng_state", None if empty else {"seed": 1000 * it + rank}, (1, WORLD),
                                   (0, rank), replica_id=0),
        "iteration": None if empty else it,
    }


def _plain(sd) -> dict:
    out = {}
    for k, v in sd.items():
        v = getattr(v, "data", v)
        out[k] = v.tolist() if hasattr(v, "tolist") else v
    return out


def worker(args) -> None:
    import datetime
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port), RANK=str(args.rank),
                      WORLD_SIZE=str(WORLD))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout * 4))
    from megatron.core import dist_checkpointing
    result: dict = {"rank": args.rank}
    if args.mode == "save":
        _cpu_shim()
        saved = {}
        for it in (1, 2):
            d = os.path.join(args.root, f"iter_{it:07d}")
            if args.rank == 0:
                os.makedirs(d, exist_ok=True)
            dist.barrier()
            sd = _state(args.rank, it, empty=False)
            saved[str(it)] = _plain(sd)
            dist_checkpointing.save(sd, d)
            dist.barrier()
            if args.rank == 0:
                with open(os.path.join(args.root, TRACKER), "w") as fh:
                    fh.write(str(it))
            dist.barrier()
        result["saved"] = saved
    else:
        args.root = args.root.replace("{rank}", str(args.rank))   # split layouts: this rank's node copy
        try:
            with open(os.path.join(args.root, TRACKER)) as fh:
                it = int(fh.read().strip())
            loaded = dist_checkpointing.load(_state(args.rank, it, empty=True),
                                             os.path.join(args.root, f"iter_{it:07d}"))
            result["iteration"] = it
            result["loaded"] = _plain(loaded)
        except BaseException as exc:  # noqa: BLE001 - what the real load raised is the label
            result["raised"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    with open(args.result, "w") as fh:
        json.dump(result, fh, default=str)
    if "raised" in result:
        os._exit(1)


def label(results, hung, saved) -> tuple[str, list]:
    detail = [r.get("raised") if r else "no result (killed or hung)" for r in results]
    if any(r and "raised" in r for r in results):
        return ("hangs" if hung else "raises"), detail
    if hung or any(r is None for r in results):
        return "hangs", detail
    for r in results:
        want = saved[r["rank"]].get(str(r["iteration"]))
        if want != r["loaded"]:
            return "wrong-state", [f"rank {r['rank']} iteration {r['iteration']}: loaded other values"]
    return "loads", detail


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "..", "fixtures", "real", "megatron-core"))
    ap.add_argument("--timeout", type=float, default=90.0)
    ap.add_argument("--worker"), ap.add_argument("--root"), ap.add_argument("--rank", type=int)
    ap.add_argument("--port", type=int), ap.add_argument("--result"), ap.add_argument("--stage")
    ap.add_argument("--splits", action="store_true", help="label node-local layouts of the committed fixture "
                    "(preflight_splits.json) instead of regenerating it")
    ap.add_argument("--cases", help="comma-separated case names: label only these on the committed fixture and "
                    "merge them into its outcomes.json (the fixture is not rewritten)")
    ap.add_argument("--relabel", action="store_true", help="label every case on the committed fixture (its "
                    "bytes kept) instead of saving a new one; what was saved at each iteration is what its "
                    "healthy load returns (the committed `healthy: loads` label)")
    args = ap.parse_args()
    if args.worker:
        args.mode = args.worker
        return worker(args)
    import megatron.core
    import torch
    healthy = os.path.join(args.out, "torch_dist")
    if args.splits:
        return label_splits(args, healthy, megatron.core.__version__, torch.__version__.split("+")[0])
    if args.relabel or args.cases:
        saved = _saved_by_healthy_loads(healthy, args.timeout)
    else:
        shutil.rmtree(healthy, ignore_errors=True)
        os.makedirs(healthy)
        res, hung = run_ranks_cmd(__file__, "save", [], healthy, args.timeout)
        assert not hung and all(r and "saved" in r for r in res), res
        saved = [r["saved"] for r in res]
    doc = {"library": "megatron-core", "version": megatron.core.__version__, "torch": torch.__version__.split("+")[0],
           "generator": "tests/conformance/gen_megatron.py", "world_size": WORLD,
           "stages": {"torch_dist": {"root": "torch_dist", "cases": {}}}}
    if args.cases:
        with open(os.path.join(args.out, "outcomes.json")) as fh:
            doc = json.load(fh)
        assert doc["version"] == megatron.core.__version__, "the fixture was made with another megatron-core"
    for case in cases():
        if args.cases and case["name"] not in args.cases.split(","):
            continue
        with tempfile.TemporaryDirectory() as t:
            root = damage.copy_and_apply(healthy, os.path.join(t, "run"), case["ops"])
            res, hung = run_ranks_cmd(__file__, "load", [], root, args.timeout, prefix=damage.unprivileged(case["ops"]))
            outcome, detail = label(res, hung, saved)
            detail = [d.replace(root, "<root>") if isinstance(d, str) else d for d in detail]
        doc["stages"]["torch_dist"]["cases"][case["name"]] = {"ops": case["ops"], "names": case["names"],
                                                              "outcome": outcome, "detail": detail}
        print(f"torch_dist {case['name']}: {outcome} {detail}", flush=True)
    damage.write_outcomes(args.out, doc)


def _saved_by_healthy_loads(healthy: str, timeout: float) -> list[dict]:
    """Per rank, {iteration: values} as loaded from the undamaged fixture at each iteration."""
    saved: list[dict] = [{} for _ in range(WORLD)]
    for it in (1, 2):
        with tempfile.TemporaryDirectory() as t:
            root = damage.copy_and_apply(healthy, os.path.join(t, "run"), [["write", TRACKER, str(it)]])
            res, hung = run_ranks_cmd(__file__, "load", [], root, timeout)
        assert not hung and all(r and "loaded" in r for r in res), res
        for r in res:
            saved[r["rank"]][str(it)] = r["loaded"]
    return saved


def blamed(res, want, detail) -> list[int]:
    """The ranks whose own read failed: those a CheckpointException names (every rank raises it,
    naming the culprits), else those whose error was not a peer's connection dropping (the
    collateral of a crashed rank), else those that loaded other values."""
    import re
    named = {int(x) for d in detail for m in re.finditer(r"ranks:dict_keys\(\[([0-9, ]*)\]\)", d)
             for x in m.group(1).split(",") if x.strip()}
    if named:
        return sorted(named)
    own = [r for r, d in enumerate(detail) if d != "ok" and "Connection closed by peer" not in d
           and "Timeout" not in d]
    return own or [r for r in range(WORLD) if res[r] is None or res[r].get("loaded") != want[r]]


def _write_read_plan(path: str) -> None:
    """The keys each rank's sharded state dict holds (what it asks dist_checkpointing.load for), as
    ckptdoctor.read_plan/v1: the record `preflight --read-plan` takes when the save kept none."""
    from megatron.core.dist_checkpointing import ShardedObject, ShardedTensor
    held: dict[str, list[int]] = {}
    for r in range(WORLD):
        for v in _state(r, 2, empty=True).values():
            key = v.unique_key if isinstance(v, ShardedObject) else v.key if isinstance(v, ShardedTensor) else None
            if key is not None:
                held.setdefault(key, []).append(r)
    doc = {"schema": "ckptdoctor.read_plan/v1", "world": WORLD,
           "keys": {k: "all" if len(rs) == WORLD else rs for k, rs in sorted(held.items())}}
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.write("\n")


def label_splits(args, healthy: str, version: str, torch_version: str) -> None:
    """Each split: every rank loads from its own node's copy; a rank that fails is one whose read
    raised (or that never returned)."""
    with open(os.path.join(args.out, "outcomes.json")) as fh:
        saved_doc = json.load(fh)
    res, hung = run_ranks_cmd(__file__, "load", [], healthy, args.timeout)
    want = {r["rank"]: r["loaded"] for r in res}          # what the healthy run loads, per rank
    doc = {"library": "megatron-core", "version": version, "torch": torch_version, "fixture_version":
           saved_doc["version"], "generator": "tests/conformance/gen_megatron.py --splits", "nodes": NODES,
           "ranks_per_node": 1, "splits": {}}
    for sp in splits():
        with tempfile.TemporaryDirectory() as t:
            for n, ops in sp["ops"].items():
                damage.copy_and_apply(healthy, os.path.join(t, n), ops)
            res, hung = run_ranks_cmd(__file__, "load", [], os.path.join(t, "n{rank}"), args.timeout)
            detail = [(x or {}).get("raised", "ok" if x else "no result").replace(t, "<nodes>") for x in res]
            failed = blamed(res, want, detail)
        doc["splits"][sp["name"]] = {"ops": sp["ops"], "failed_ranks": failed, "hung": hung,
                                     "detail": [d.splitlines()[0][:200] for d in detail]}
        print(f"{sp['name']}: failed {failed} {'(hung)' if hung else ''} {detail}", flush=True)
    _write_read_plan(os.path.join(args.out, "read_plan.json"))
    with open(os.path.join(args.out, "preflight_splits.json"), "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.write("\n")


if __name__ == "__main__":
    main()
