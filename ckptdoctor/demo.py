"""`ckptdoctor demo`: build a small realistic run with injected faults, then diagnose it.

Runs without torch: checkpoints are written by the torch-free DCP writer (torch itself loads
them).  Each scene says what was broken and shows what the doctor reports.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

from .layouts import dcp_writer as W

LAYERS = 2
HIDDEN = 8
RANKS = 4


def _items(step: int) -> list[W.Item]:
    items = []
    rows = HIDDEN // RANKS
    for layer in range(LAYERS):
        fqn = f"decoder.layers.{layer}.mlp.weight"
        for r in range(RANKS):
            vals = [float(step + layer + r + i / 10) for i in range(rows * HIDDEN)]
            items.append(W.Item(fqn, (HIDDEN, HIDDEN), (r * rows, 0), (rows, HIDDEN), vals, rank=r))
    items.append(W.Item("iteration", None, payload=W.int_payload(step), rank=0))
    return items


def _megatron_finalize(d: str, step: int) -> None:
    """What megatron-core 0.16 writes beside the DCP files: common.pt (rank 0's torch.save of the
    common state, read by every rank on load) and metadata.json, which records that backend."""
    import pickle
    with open(os.path.join(d, "common.pt"), "wb") as fh:
        fh.write(W.object_archive(pickle.dumps({"iteration": step}, protocol=2)))
    with open(os.path.join(d, "metadata.json"), "w") as fh:
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                   "common_backend": "torch", "common_backend_version": 1}, fh)


def build_run(root: str) -> dict[str, str]:
    """A Megatron torch_dist run root: three iterations, tracker at the newest. Returns faults."""
    os.makedirs(root, exist_ok=True)
    for step in (100, 200, 300):
        d = os.path.join(root, f"iter_{step:07d}")
        W.write(d, _items(step))
        _megatron_finalize(d, step)
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as fh:
        fh.write("300")
    # fault 1: iteration 300's rank-2 shard was cut short by a full disk during the copy
    shard = os.path.join(root, "iter_0000300", "__2_0.distcp")
    os.truncate(shard, os.path.getsize(shard) // 2)
    # fault 2: iteration 200 was re-saved into the same directory and the crash hit while committing
    open(os.path.join(root, "iter_0000200", ".metadata.tmp"), "wb").write(b"\x80\x04")
    return {"iter_0000300": "rank 2's shard truncated to half (full disk during copy)",
            "iter_0000200": "a second save crashed while committing (.metadata.tmp left behind)"}


_MARK = ".ckptdoctor-demo"


def _demo_dir(directory: str) -> str:
    """DIR must be new, empty, or an earlier demo (which is replaced): the demo never writes among
    someone's files."""
    import shutil
    from .engine.errors import UsageError
    if os.path.isdir(directory) and os.listdir(directory):
        if not os.path.isfile(os.path.join(directory, _MARK)):
            raise UsageError(f"{directory}: not empty; the demo writes only into a new or empty directory")
        for e in os.listdir(directory):
            p = os.path.join(directory, e)
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
    os.makedirs(directory, exist_ok=True)
    open(os.path.join(directory, _MARK), "w").close()
    return directory


def run_demo(directory: str | None, fmt: str = "text") -> int:
    from .api import make_engine
    from .commands import verify as flow
    from .report import render
    root = _demo_dir(directory) if directory else tempfile.mkdtemp(prefix="ckptdoctor-demo-")
    run = os.path.join(root, "megatron-run")
    out = sys.stdout
    faults = build_run(run)
    if fmt == "text":
        out.write(f"ckptdoctor demo: a Megatron-LM run root with 3 checkpoints in {run}\n")
        for k, v in faults.items():
            out.write(f"  injected fault in {k}: {v}\n")
        out.write(f"\n$ ckptdoctor verify {run}\n")
    eng = make_engine("verify", run)
    flow.run(run, eng)
    render(eng.report, fmt, out)
    if fmt == "text":
        out.write("\nWhat this means: the tracker sends the relaunch to iter_0000300, whose shard is "
                  "truncated under a valid .metadata,\nso the job would crash at load (or worse). "
                  "iter_0000100 is the newest checkpoint that will load; repoint the tracker there.\n"
                  "Try: ckptdoctor rules CKD104   |   ckptdoctor verify --format json " + run + "\n")
    caught = eng.report.failed()
    # scene 2: content verification -- a manifest, then a bit flip that keeps every size intact
    from .commands.manifest import write_manifest
    good = os.path.join(run, "iter_0000100")
    write_manifest(good, quiet=True)
    shard = os.path.join(good, "__1_0.distcp")
    with open(shard, "r+b") as fh:
        fh.seek(os.path.getsize(shard) - 200)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x01]))
    if fmt == "text":
        out.write(f"\n$ ckptdoctor manifest {good}      # done before the fault below\n"
                  f"# injected fault: one bit flipped in {shard} (same size, structure intact)\n"
                  f"$ ckptdoctor verify --checksums {good}\n")
    eng2 = make_engine("verify", good, checksums=True)
    flow.run(good, eng2)
    render(eng2.report, fmt, out)
    caught = caught and "CKD151" in eng2.report.rules()
    caught = _reconcile_scene(root, fmt, out) and caught
    caught = _publish_scene(root, run, fmt, out) and caught
    caught = _preflight_scene(root, fmt, out) and caught
    caught = _doctor_scene(run, fmt, out) and caught
    caught = _contract_scene(root, run, fmt, out) and caught
    caught = _forensics_scene(root, run, fmt, out) and caught
    return 0 if caught else 1  # the demo succeeds when the doctor catches every injected fault


def _write_pt(path: str, obj) -> None:
    """A torch.save-format archive of plain data (zip, stored, archive/data.pkl), without torch."""
    import pickle
    import zipfile
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pickle.dumps(obj, protocol=2))
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/version", "3\n")


def build_rl_step(root: str) -> str:
    """A NeMo-RL async GRPO step_7 whose dataloader ran one batch ahead of the saved cursor."""
    import hashlib
    d = os.path.join(root, "step_7")
    os.makedirs(os.path.join(d, "data_plane"), exist_ok=True)
    with open(os.path.join(d, "training_info.json"), "w") as fh:
        json.dump({"consumed_samples": 28, "current_step": 7, "current_epoch": 0, "total_steps": 7,
                   "trainer_version": 7, "sampler_name": "in_order", "sampler_dispatch_index": 6}, fh)
    with open(os.path.join(d, "config.yaml"), "w") as fh:
        fh.write("grpo: {num_prompts_per_step: 4, num_generations_per_prompt: 8}\n"
                 "async_rl: {sampler: {name: in_order, max_lookahead_versions: 1}}\n")
    _write_pt(os.path.join(d, "train_dataloader.pt"),
              {"_num_yielded": 8, "_sampler_iter_yielded": 8, "_iterator_finished": False})
    groups = [{"group_id": f"g{i}", "target_step": 7, "start_weight": 6, "end_weight": 6,
               "meta": {"sample_ids": [f"g{i}_g{j}" for j in range(8)]}} for i in range(4)]
    digest = hashlib.sha256(b"g0g1g2g3").hexdigest()
    _write_pt(os.path.join(d, "replay_buffer_metadata.pt"),
              {"schema_version": 1, "manifest_digest": digest, "groups": groups})
    with open(os.path.join(d, "data_plane", "metadata.json"), "w") as fh:
        json.dump({"user_metadata": {"replay_manifest_digest": digest, "replay_group_count": 4,
                                     "single_controller_train_steps": 7,
                                     "single_controller_trainer_version": 7}}, fh)
    return d


def _reconcile_scene(root: str, fmt: str, out) -> bool:
    from .api import make_engine
    from .commands import reconcile as flow
    from .report import render
    step = build_rl_step(os.path.join(root, "nemo-rl-run"))
    if fmt == "text":
        out.write(f"\n# scene 3: an RL checkpoint (NeMo-RL async GRPO) saved with its sampler cursor at 6, "
                  f"4 finished groups for step 7,\n# and a dataloader that had already pulled batch 8\n"
                  f"$ ckptdoctor reconcile --simulate {step}\n")
    view = flow.load(step, None, [])
    eng = make_engine("reconcile", step)
    flow.run(view, eng, simulate=True)
    render(eng.report, fmt, out)
    found = "CKD303" in eng.report.rules()
    written, backup, change = flow.fix(view)
    view = flow.load(step, None, [])
    eng2 = make_engine("reconcile", step)
    flow.run(view, eng2, simulate=True)
    if fmt == "text":
        out.write(f"\n$ ckptdoctor reconcile --fix {step}\n# {change}; backup {os.path.basename(backup)}\n")
    render(eng2.report, fmt, out)
    return found and not eng2.report.failed()


def _publish_scene(root: str, run: str, fmt: str, out) -> bool:
    """publish refuses the truncated checkpoint, publishes a good one whole, moves the tracker."""
    from .api import make_engine
    from .commands import publish as flow
    from .commands import verify as vflow
    from .report import render
    durable = os.path.join(root, "durable-run")
    ok = True
    for name in ("iter_0000300", "iter_0000200"):
        src = os.path.join(run, name)
        if name == "iter_0000200":
            # scene 1 called iter_0000200 incomplete (CKD102): the crashed second save left .metadata.tmp
            # beside the first save's whole .metadata; the operator removes the leftover, on screen
            leftover = os.path.join(src, ".metadata.tmp")
            if fmt == "text":
                out.write("\n# iter_0000200 was refused in scene 1 only for its leftover: the second save crashed "
                          "while committing,\n# and its first save's .metadata and shards are whole. "
                          "The operator removes the leftover:\n"
                          f"$ rm {leftover}\n$ ckptdoctor verify {src}\n")
            os.unlink(leftover)
            veng = make_engine("verify", src)
            vflow.run(src, veng)
            render(veng.report, fmt, out)
            ok = ok and not veng.report.failed()
        if fmt == "text":
            out.write("\n# scene 4: publish from node-local disk to durable storage\n" if name == "iter_0000300"
                      else "\n")
            out.write(f"$ ckptdoctor publish {src} {durable}\n")
        eng = make_engine("publish", src)
        res = flow.run(src, durable, eng)
        render(eng.report, fmt, out)
        ok = ok and ((res is None) if name == "iter_0000300" else (res is not None and res.status == "published"))
    eng = make_engine("verify", durable, checksums=True)
    if fmt == "text":
        out.write(f"\n$ ckptdoctor verify --checksums {durable}\n")
    vflow.run(durable, eng)
    render(eng.report, fmt, out)
    return ok and not eng.report.failed() and eng.report.facts.get("resume_from") == "iter_0000200"


def _preflight_scene(root: str, fmt: str, out) -> bool:
    """Node-local shards on gpu[01-02]; the relaunch swaps gpu02 for gpu03."""
    import shutil
    from .api import make_engine
    from .commands import preflight as flow
    from .report import render
    src = os.path.join(root, "nvme-save", "iter_0000100")
    W.write(src, _items(100))
    with open(os.path.join(src, "metadata.json"), "w") as fh:
        json.dump({"sharded_backend": "torch_dist"}, fh)
    nodes = os.path.join(root, "nodes")
    for i, node in enumerate(("gpu01", "gpu02", "gpu03")):
        d = os.path.join(nodes, node, "run7", "iter_0000100")
        os.makedirs(d)
        for f in os.listdir(src):
            if f.endswith(".distcp") and (int(f[2:].split("_")[0]) // 2 != i or node == "gpu03"):
                continue  # each node holds its own ranks' shards; the fresh gpu03 holds none
            shutil.copy2(os.path.join(src, f), d)
        with open(os.path.join(nodes, node, "run7", "latest_checkpointed_iteration.txt"), "w") as fh:
            fh.write("100")
    loc = os.path.join(nodes, "{node}", "run7")
    if fmt == "text":
        out.write("\n# scene 5: node-local checkpoints on gpu[01-02]; the relaunch got gpu[01,03]\n"
                  f"$ ckptdoctor preflight '{loc}' --nodelist 'gpu[01,03]' --ranks-per-node 2\n")
    eng = make_engine("preflight", loc)
    flow.run(loc, eng, flow.allocation("gpu[01,03]", "2", None))
    render(eng.report, fmt, out)
    return "CKD401" in eng.report.rules() and "CKD406" in eng.report.rules()


def _doctor_scene(run: str, fmt: str, out) -> bool:
    """The doctor's actions on the first run root: the relaunch gate says no, `verify --fix`
    repoints the tracker at the newest complete checkpoint (with a backup), the gate says yes;
    `prune --dry-run` shows what a retention policy would remove, and removes nothing."""
    from .api import make_engine
    from .commands import fix as doctor
    from .commands import prune as pflow
    from .commands import verify as vflow
    from .report import render
    if fmt == "text":
        out.write(f"\n# scene 6: repair before the relaunch\n$ ckptdoctor verify --target resume {run}   # the gate\n")
    gate = make_engine("verify", run)
    vflow.run(run, gate, target="resume")
    if fmt == "text":
        out.write(f"verify --target resume: {'FAIL' if gate.report.failed() else 'ok'} "
                  f"(the framework would resume from {gate.report.facts.get('resume_from')})\n"
                  f"$ ckptdoctor verify --fix --target resume {run}\n")
    eng = doctor.run_and_fix(run, lambda: make_engine("verify", run), layout=None, target="resume", fix_to=None,
                             quarantine=False, say=lambda line: fmt == "text" and out.write(f"# {line}\n"))
    render(eng.report, fmt, out)
    if fmt == "text":
        out.write(f"\n$ ckptdoctor prune --keep-last 1 --dry-run {run}\n")
    pr = make_engine("prune", run)
    plan = pflow.run(run, pr, keep_last=1, keep_every=None, dry_run=True)
    if fmt == "text":
        for n in plan["removed"]:
            out.write(f"would remove {n}\n")
        for n, why in plan["kept"].items():
            out.write(f"kept {n}: {why}\n")
    return gate.report.failed() and not eng.report.failed() and os.path.isdir(os.path.join(run, "iter_0000100"))


def _contract_scene(root: str, run: str, fmt: str, out) -> bool:
    """The run contract: recorded once, then an edited recipe is caught before the relaunch."""
    from . import contract as C
    from .api import make_engine
    from .commands import contract as cflow
    from .report import render
    recipe = os.path.join(root, "recipe.yaml")
    with open(recipe, "w") as fh:
        fh.write("lr: 3.0e-4\nglobal_batch_size: 512\n")
    if os.path.exists(C.path_in(run)):  # an earlier demo in this directory
        os.remove(C.path_in(run))
    c = C.init(run, None, [], [recipe], 1000)
    with open(recipe, "w") as fh:
        fh.write("lr: 6.0e-4\nglobal_batch_size: 512\n")
    if fmt == "text":
        out.write(f"\n# scene 7: the run contract\n$ ckptdoctor contract init {run} --recipe {recipe} --total-steps 1000\n"
                  f"# {cflow.describe(c)}\n# injected fault: the learning rate in {recipe} was edited before the relaunch\n"
                  f"$ ckptdoctor contract check {run} --total-steps 1000\n")
    eng = make_engine("contract", run)
    cflow.check(run, eng, 1000)
    render(eng.report, fmt, out)
    return "CKD513" in eng.report.rules()


def _forensics_scene(root: str, run: str, fmt: str, out) -> bool:
    """Forensics: the log of the relaunch that loaded iter_0000300 before the fix (its lines in the shape
    torch 2.13 prints them, as tests/fixtures/real/forensics/dcp-shard-truncated recorded them): rank 1 was only
    stopped by the launcher; the first failure and the damaged file are named."""
    from .api import make_engine
    from .commands import forensics as fflow
    from .report import render
    ck = os.path.join(run, "iter_0000300")
    tb = ["Traceback (most recent call last):",
          '  File "torch/distributed/checkpoint/state_dict_loader.py", line 314, in _load_state_dict']
    lines = [f"2026-12-03 12:01:07.{r}00 rank{r} INFO loading checkpoint from {ck}" for r in range(2)]
    for r in range(2):
        lines += [f"[rank{r}]: {t}" for t in tb]
        lines.append(f"[rank{r}]: torch.distributed.checkpoint.api.CheckpointException: CheckpointException "
                     f"ranks:dict_keys([0])")
        lines += [f"[rank{r}]: Traceback (most recent call last): (RANK 0)",
                  f'[rank{r}]:   File "torch/distributed/checkpoint/filesystem.py", line 871, in read_data',
                  f"[rank{r}]: EOFError", ""]
    lines += ["Root Cause (first observed failure):", "[0]:", "  time      : 2026-12-03_12:01:08",
              "  host      : gpu01", "  rank      : 1 (local_rank: 1)", "  exitcode  : -15 (pid: 4242)  (SIGTERM)",
              "  error_file: <N/A>", "  traceback : Signal 15 (SIGTERM) received by PID 4242"]
    log = os.path.join(root, "relaunch.log")
    with open(log, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    if fmt == "text":
        out.write(f"\n# scene 8: forensics of the relaunch that loaded iter_0000300 before the fix\n"
                  f"$ ckptdoctor forensics {log} --run-root {run}\n")
    eng = make_engine("forensics", log)
    fflow.run([log], eng, run, lambda path: make_engine("verify", path))
    render(eng.report, fmt, out)
    ck_facts = eng.report.facts.get("checkpoint") or {}
    return "CKD601" in eng.report.rules() and any(x["rule"] == "CKD104" for x in ck_facts.get("linked", []))

