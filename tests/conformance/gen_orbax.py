"""Generator: Orbax checkpoints written by orbax-checkpoint itself, damaged, labelled by its own restore.

    python tests/conformance/gen_orbax.py [--out tests/fixtures/real/orbax]

Needs orbax-checkpoint and jax (the `conformance` extra; CPU is enough).  A CheckpointManager saves a
small pytree (StandardSave) at steps 1 and 2 of a run root; then for every case of the damage matrix
(tests/conformance/damage.py) a copy of the root is damaged and a fresh process builds a manager on it,
asks `latest_step()` and restores that step both ways a training script resumes: `restore(step)` with
no arguments (the item handlers recorded in the step's _CHECKPOINT_METADATA say how), and, in another
fresh manager, `restore(step, args=StandardRestore(abstract_tree))`:

  loads               both ways: the latest step is 2 and the restored tree equals what was saved at 2
  loads-with-args     only with explicit args (the no-argument restore raised): a script that passes
                      args resumes, one that relies on the recorded handlers fails
  raises              both ways raised (type and text recorded)
  wrong-state         it restored another step's tree, or a tree that differs
"""
from __future__ import annotations

import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import damage  # noqa: E402


def cases() -> list[dict]:
    return [
        {"name": "healthy", "ops": [], "names": None},
        {"name": "checkpoint-metadata-missing", "ops": [["delete", "2/_CHECKPOINT_METADATA"]],
         "names": "2/_CHECKPOINT_METADATA"},
        {"name": "commit-success-missing", "ops": [["delete", "2/commit_success.txt"]], "names": "2"},
        {"name": "item-manifest-missing", "ops": [["delete", "2/default/manifest.ocdbt"]],
         "names": "2/default"},
        {"name": "item-metadata-missing", "ops": [["delete", "2/default/_METADATA"]], "names": "2/default"},
        {"name": "empty-newer-step", "ops": [["mkdir", "3"]], "names": "3"},
        {"name": "killed-newer-save", "ops": [["copy_partial", "2", "3.orbax-checkpoint-tmp-1", "_CHECKPOINT*"]],
         "names": "3.orbax-checkpoint-tmp-1"},
        # a file this user may not read (another user's umask, a copy that kept modes)
        *({"name": f"{name}-unreadable", "ops": [["unreadable", f"2/{f}"]], "names": f"2/{f}"} for name, f in (
            ("commit-success", "commit_success.txt"), ("checkpoint-metadata", "_CHECKPOINT_METADATA"),
            ("item-manifest", "default/manifest.ocdbt"), ("item-metadata", "default/_METADATA"),
            ("item-data", f"default/d/{_data_file()}"), ("process-copy", "default/ocdbt.process_0/manifest.ocdbt"),
            ("item-commit-success", "default/commit_success.txt"), ("item-dir", "default"),
            ("item-nodes-dir", "default/d"))),
        {"name": "item-dir-unlistable", "ops": [["unlistable", "2/default"]], "names": "2/default"},
        {"name": "item-nodes-dir-unlistable", "ops": [["unlistable", "2/default/d"]], "names": "2/default/d"},
    ]


def _data_file() -> str:
    """The one data file of the committed fixture's step 2 (its name is a random hash)."""
    d = os.path.join(HERE, "..", "fixtures", "real", "orbax", "run", "2", "default", "d")
    return sorted(os.listdir(d))[0] if os.path.isdir(d) else "missing"


def worker(mode: str, root: str, result: str) -> None:
    import numpy as np
    import orbax.checkpoint as ocp
    seen: dict = {}
    try:
        mgr = ocp.CheckpointManager(root)
        if mode == "save":
            for step in (1, 2):
                tree = {"w": np.full((4, 3), float(step), dtype=np.float32), "step": np.int32(step)}
                mgr.save(step, args=ocp.args.StandardSave(tree))
            mgr.wait_until_finished()
            seen["ok"] = True
        else:
            step = mgr.latest_step()
            seen["latest"] = step
            got = mgr.restore(step)
            seen["w"] = float(np.asarray(got["w"]).mean())
            seen["step"] = int(np.asarray(got["step"]))
        mgr.close()
    except BaseException as exc:  # noqa: BLE001 - what the real restore raised is the label
        seen["raised"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    if mode != "save":
        try:
            mgr = ocp.CheckpointManager(root)
            abstract = {"w": np.zeros((4, 3), dtype=np.float32), "step": np.zeros((), dtype=np.int32)}
            got = mgr.restore(mgr.latest_step(), args=ocp.args.StandardRestore(abstract))
            seen["with_args"] = {"latest": mgr.latest_step(), "w": float(np.asarray(got["w"]).mean()),
                                 "step": int(np.asarray(got["step"]))}
            mgr.close()
        except BaseException as exc:  # noqa: BLE001
            seen["with_args"] = {"raised": f"{type(exc).__name__}: {str(exc)[:300]}"}
    with open(result, "w") as fh:
        json.dump(seen, fh)


def run(mode: str, root: str, ops: list = ()) -> dict:
    return damage.run_worker(__file__, mode, root, {"JAX_PLATFORMS": "cpu"}, prefix=damage.unprivileged(list(ops)))


def label(seen: dict) -> tuple[str, list]:
    if "raised" in seen:
        wa = seen.get("with_args") or {}
        if "raised" not in wa and wa.get("latest") == 2 and wa.get("step") == 2 and wa.get("w") == 2.0:
            return "loads-with-args", [f"restore(step) without args: {seen['raised']}"]
        return "raises", [seen["raised"], f"with args: {wa.get('raised', wa)}"]
    if seen.get("latest") != 2 or seen.get("step") != 2 or seen.get("w") != 2.0:
        return "wrong-state", [f"latest {seen.get('latest')}, restored step {seen.get('step')}, w {seen.get('w')}"]
    return "loads", []


def main() -> None:
    args = damage.generator_args(__doc__, "orbax")
    if args.worker:
        return worker(args.worker, args.root, args.result)
    import orbax.checkpoint
    from importlib.metadata import version
    healthy = os.path.join(args.out, "run")
    judge = lambda root, case: label(run("load", root, case["ops"]))  # noqa: E731
    if args.cases:
        return damage.relabel(args.out, version("orbax-checkpoint"), "orbax", healthy, cases(), args.cases, judge)
    shutil.rmtree(healthy, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    got = run("save", os.path.abspath(healthy))
    assert got.get("ok"), f"the healthy save failed: {got}"
    doc = {"library": "orbax-checkpoint", "version": version("orbax-checkpoint"), "jax": version("jax"),
           "generator": "tests/conformance/gen_orbax.py", "world_size": 1,
           "stages": {"orbax": {"root": "run", "cases": {}}}}
    del orbax
    damage.run_cases(doc, "orbax", healthy, cases(), judge)
    damage.write_outcomes(args.out, doc)

if __name__ == "__main__":
    main()
