"""reconcile: the three-way check, the simulator's seed cases, the mapping of real NeMo-RL files,
and the repair that is only offered when the simulator proves it safe."""
import hashlib
import json
import os
import subprocess
import sys

import pytest

from ckptdoctor import api
from ckptdoctor.runstate.simulate import SimInput, restored_with_ids, simulate
from conftest import needs_torch
from helpers import as_unprivileged, assert_fires, assert_no_errors, cli

# ---- simulator: the eight seed cases of reconcile.md §6 (N=4, L=1, T=7) ----------------------
T7 = [(7, None)] * 4


def _sim(c, a, groups, steps=4):
    return simulate(SimInput(4, 1, 7, c, a, restored_with_ids(groups, 4), steps=steps))


def _row(r, step):
    row = next(x for x in r.rows if x.step == step)
    return (row.batch, row.dispatched, row.dropped, row.dedupe, row.lost)


def test_s1_aligned_dedupes_by_count():
    r = _sim(6, 7, T7)
    assert _row(r, 7) == (7, 0, 4, 4, 0)
    assert r.lost_prompts == [] and r.duplicate_prompts == [] and r.lost_at_save == []
    assert r.stalled_at is None


def test_s2_dataloader_ahead_loses_a_batch():
    r = _sim(6, 8, T7)
    assert _row(r, 7) == (8, 0, 4, 0, 4)
    assert r.lost_prompts == [32, 33, 34, 35]


def test_s3_self_heal_and_its_in_flight_loss():
    r = _sim(6, 7, [])
    assert _row(r, 7) == (7, 4, 0, 0, 0)
    r = _sim(6, 8, [])
    assert _row(r, 7) == (8, 4, 0, 0, 0)
    assert r.lost_at_save == [28, 29, 30, 31]


def test_s4_repair_of_s2():
    r = _sim(7, 8, T7)
    assert r.trained[0] == {"step": 7, "restored": 4, "fresh": 0}
    assert _row(r, 8)[0] == 8
    assert r.lost_prompts == [] and r.duplicate_prompts == []


def test_s5_wrong_repair_of_s1_duplicates():
    r = _sim(7, 7, T7)
    assert _row(r, 8) == (7, 4, 0, 0, 0)
    assert r.duplicate_prompts == [28, 29, 30, 31]


def test_s6_partial_step():
    r = _sim(6, 8, [(7, None)] * 2)
    assert _row(r, 7) == (8, 2, 2, 0, 2)
    assert r.lost_prompts == [34, 35]
    assert r.lost_at_save == [30, 31]


def test_s7_partial_with_raised_cursor_stalls():
    r = _sim(7, 8, [(7, None)] * 2)
    assert r.stalled_at == {"step": 7, "have": 2, "need": 4}


def test_s8_fetch_before_admit():
    r = _sim(8, 10, T7 + [(8, None)] * 4)
    assert [t["step"] for t in r.trained[:2]] == [7, 8] and all(t["restored"] == 4 for t in r.trained[:2])
    assert _row(r, 9)[0] == 10
    assert r.lost_at_save == [36, 37, 38, 39]


# ---- neutral run-state files ------------------------------------------------------------------
def state(c=6, a=7, targets=(7, 7, 7, 7), **kw):
    doc = {"schema": "ckptdoctor.run_state/v1",
           "config": {"num_prompts_per_step": 4, "group_size": 8, "sampler": "in_order",
                      "max_lookahead_versions": 1},
           "trainer": {"step": 7, "version": 7, "epoch": 0},
           "sampler": {"cursor": c, "cursor_source": "saved"},
           "dataloader": {"batches_total": a},
           "buffer": {"groups": [{"target_step": t, "status": "ready", "size": 8, "start_version": t - 1}
                                 for t in targets]}}
    for dotted, val in kw.items():
        sec, _, key = dotted.partition("__")
        doc.setdefault(sec, {})[key] = val
    return doc


def write_state(tmp_path, doc, name="state.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return str(p)


def rec(path, **kw):
    return api.reconcile(path, **kw)


def test_state_file_aligned_is_a_warning_only(tmp_path):
    rep = rec(write_state(tmp_path, state()))
    assert_fires(rep, "CKD301", severity="warning")
    assert "CKD303" not in rep.rules()
    assert_no_errors(rep)


def test_state_file_dataloader_unknown_and_buffer_ahead_is_an_error(tmp_path):
    doc = state()
    del doc["dataloader"]
    rep = rec(write_state(tmp_path, doc))
    assert_fires(rep, "CKD301", severity="error")
    assert_fires(rep, "CKD314")
    assert "dataloader.batches_total" in next(f for f in rep.findings if f.rule == "CKD314").details["unknown"]


def test_yaml_state_file_cursor_outside_window(tmp_path):
    import yaml
    p = tmp_path / "state.yaml"
    p.write_text(yaml.safe_dump(state(c=3, a=4, targets=())))
    rep = rec(str(p))
    assert_fires(rep, "CKD302", severity="error")


def test_dataloader_behind_cursor_warns_duplication(tmp_path):
    rep = rec(write_state(tmp_path, state(c=7, a=7, targets=(7, 7, 7, 7, 8, 8, 8, 8))))
    hits = assert_fires(rep, "CKD303", severity="warning")
    assert "trained twice" in hits[0].message


def test_partial_step_at_or_below_cursor_stalls(tmp_path):
    rep = rec(write_state(tmp_path, state(c=7, a=8, targets=(7, 7))))
    hits = assert_fires(rep, "CKD304", severity="error")
    assert hits[0].details == {**hits[0].details, "step": 7, "have": 2, "need": 4}
    assert rep.facts["repair"]["available"] is False


def test_targets_below_trainer_and_beyond_window(tmp_path):
    rep = rec(write_state(tmp_path, state(c=6, a=7, targets=(5, 5, 7, 9))))
    hits = assert_fires(rep, "CKD305")
    assert {h.severity for h in hits} == {"warning", "error"}


def test_stale_groups_for_windowed_sampler(tmp_path):
    doc = state(targets=(7, 7, 3, 3))
    doc["config"].update(sampler="windowed", max_staleness_versions=2)
    rep = rec(write_state(tmp_path, doc))
    hits = assert_fires(rep, "CKD306")
    assert hits[0].details["groups"] == 2


@pytest.mark.parametrize("sampler, staleness", [("in_order", 2), ("windowed", None)])
def test_old_groups_are_stale_only_for_a_sampler_that_evicts_them_by_a_known_staleness(tmp_path, sampler, staleness):
    """CKD306 needs both: a sampler that evicts by age (windowed, weight_fifo) and its
    max_staleness_versions. An in-order sampler keeps old groups; an unknown staleness decides
    nothing (and is no crash)."""
    doc = state(targets=(7, 7, 3, 3))
    doc["config"].update(sampler=sampler, max_staleness_versions=staleness)
    for g in doc["buffer"]["groups"]:
        g["start_version"] = 1
    rep = rec(write_state(tmp_path, doc))
    assert not {"CKD306", "CKD900"} & set(rep.rules()), [(f.rule, f.message) for f in rep.findings]


@pytest.mark.parametrize("reserve", [1, 3])
def test_reserve_in_shrink_mode(tmp_path, reserve):
    """Even one prompt left in the reserve under shrink mode is an error: nothing consumes it."""
    rep = rec(write_state(tmp_path, state(reserve__prompts=reserve)))
    (hit,) = assert_fires(rep, "CKD307", severity="error")
    assert hit.message.startswith(f"{reserve} prompt(s) sit in the replacement reserve"), hit.message
    assert "CKD307" not in rec(write_state(tmp_path, state(reserve__prompts=0))).rules()


def test_epoch_boundary(tmp_path):
    doc = state()
    doc["config"]["batches_per_epoch"] = 7
    doc["dataloader"].update(batches_in_epoch=7, iterator_finished=False)
    rep = rec(write_state(tmp_path, doc))
    assert_fires(rep, "CKD310", severity="warning")


def test_group_size_mismatch(tmp_path):
    doc = state()
    doc["buffer"]["groups"][0]["size"] = 4
    rep = rec(write_state(tmp_path, doc))
    assert_fires(rep, "CKD312", severity="error")


def test_every_field_nullable_and_unknown_is_not_zero(tmp_path):
    rep = rec(write_state(tmp_path, {"schema": "ckptdoctor.run_state/v1"}))
    hits = assert_fires(rep, "CKD314")
    assert set(hits[0].details["unknown"]) == {"config.num_prompts_per_step", "config.max_lookahead_versions",
                                               "trainer.version", "sampler.cursor", "dataloader.batches_total"}
    assert_no_errors(rep)


@pytest.mark.parametrize("content, words", [
    ('{"schema": "something/else"}', "expected 'ckptdoctor.run_state/v1'"),
    ('{"schema": "ckptdoctor.run_state/v1", "sampler": {"cursor": "six"}}', "sampler.cursor: expected int"),
    ('{"schema": "ckptdoctor.run_state/v1", "trainer": {"steps": 1}}', "unknown field(s) steps"),
    ('{"schema": "ckptdoctor.run_state/v1", "buffer": {"groups": [{"target_step": 7, "status": "done"}]}}',
     "buffer.groups[0].status 'done': use one of"),
    ("{not json", "not valid JSON"),
])
def test_bad_state_file_is_one_line_exit_2(tmp_path, content, words):
    p = tmp_path / "state.json"
    p.write_text(content)
    rc, out, err = cli("reconcile", str(p))
    assert rc == 2 and words in err and str(p) in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_group_whose_status_is_not_recorded_is_read_as_unknown(tmp_path):
    """A buffer group without a status is a group of unknown status, not a bad state file."""
    doc = state()
    for g in doc["buffer"]["groups"]:
        del g["status"]
    rc, out, err = cli("reconcile", "-f", "json", write_state(tmp_path, doc))
    assert rc in (0, 1) and not err.strip(), err
    assert "CKD301" in {f["rule"] for f in json.loads(out)["findings"]}


def test_simulate_json_contract(tmp_path):
    rc, out, err = cli("reconcile", "--simulate", "--format", "json", write_state(tmp_path, state(a=8)))
    assert rc == 1, err
    sim = json.loads(out)["facts"]["simulation"]
    assert {"steps", "lost_prompts", "duplicate_prompts", "stalled_at"} <= set(sim)
    assert set(sim["steps"][0]) == {"step", "batch", "dispatched", "dropped", "dedupe", "lost"}
    assert sim["steps"][0] == {"step": 7, "batch": 8, "dispatched": 0, "dropped": 4, "dedupe": 0, "lost": 4}
    assert sim["lost_prompts"] == [32, 33, 34, 35] and sim["stalled_at"] is None


def test_fix_on_state_file_aligns_cursor_with_backup(tmp_path):
    path = write_state(tmp_path, state(a=8))
    original = open(path, "rb").read()
    rc, out, err = cli("reconcile", "--fix", "--format", "json", path)
    assert rc == 0, (out, err)
    assert json.load(open(path))["sampler"]["cursor"] == 7
    backups = [p for p in os.listdir(tmp_path) if ".ckptdoctor-bak-" in p]
    assert len(backups) == 1 and (tmp_path / backups[0]).read_bytes() == original
    facts = json.loads(out)["facts"]
    assert facts["fixed"]["change"].endswith("6 -> 7")
    assert facts["simulation_before_fix"]["lost_prompts"] == [32, 33, 34, 35]
    assert facts["simulation"]["lost_prompts"] == []


def test_fix_refuses_the_wrong_repair_when_aligned(tmp_path):
    path = write_state(tmp_path, state(a=7))
    before = open(path, "rb").read()
    rc, out, err = cli("reconcile", "--fix", path)
    assert rc == 0 and "no automatic repair" in err and "train a batch twice" in err
    assert open(path, "rb").read() == before
    assert [p for p in os.listdir(tmp_path)] == ["state.json"]


def test_fix_refuses_when_it_would_stall(tmp_path):
    path = write_state(tmp_path, state(c=6, a=8, targets=(7, 7)))
    before = open(path, "rb").read()
    rc, out, err = cli("reconcile", "--fix", path)
    assert rc == 1 and "no automatic repair" in err and "stall" in err
    assert open(path, "rb").read() == before


def test_fix_refuses_when_the_last_step_it_would_hand_out_is_not_exactly_full(tmp_path):
    """The repair raises the cursor to A-1; every step up to and including A-1 must hold exactly N
    groups.  Step 7 = A-1 holding 5 groups for N=4 is refused, naming the step, and nothing is written."""
    path = write_state(tmp_path, state(c=6, a=8, targets=(7, 7, 7, 7, 7)))
    before = open(path, "rb").read()
    rc, out, err = cli("reconcile", "--fix", path)
    assert "no automatic repair" in err and "step(s) 7 in (6, 7]" in err and "exactly 4 groups" in err, err
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["state.json"]


# ---- real NeMo-RL step directories (torch.save archives, read without torch) -------------------
@pytest.fixture
def nemo(tmp_path):
    pytest.importorskip("torch")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fixtures"))
    import nemo_rl_ckpt
    return lambda **kw: nemo_rl_ckpt.write_step(tmp_path / "ckpts", **kw)


def _snapshot(root):
    out = {}
    for dp, dn, fn in os.walk(root):
        for n in dn + fn:
            p = os.path.join(dp, n)
            st = os.lstat(p)
            out[p] = (st.st_size, st.st_mtime_ns, hashlib.sha256(open(p, "rb").read()).hexdigest()
                      if os.path.isfile(p) else None)
    return out


@needs_torch
def test_nemo_rl_seed_case_aligned(nemo):
    d = nemo(cursor=6, batches=7)
    rep = rec(d)
    assert rep.facts["profile"] == "nemo-rl/sc-tq"
    hits = assert_fires(rep, "CKD301", severity="warning", path_contains="training_info.json")
    assert hits[0].details["evidence"]["sampler.cursor"] == "training_info.json:sampler_dispatch_index"
    assert_no_errors(rep)


@needs_torch
def test_a_group_field_of_the_wrong_type_in_a_real_checkpoint_is_named_and_read_as_unknown(nemo):
    """A replay-buffer group whose target_step is not an integer (7.5) is a CKD313 error naming the
    file it came from and the field, and that group's step is unknown: never coerced, never a
    crash of the whole read."""
    d = nemo(cursor=6, batches=7, targets=(7.5, 7, 7, 7))
    rep = rec(d)
    hit = assert_fires(rep, "CKD313", path_contains="replay_buffer_metadata.pt", severity="error")[0]
    assert hit.message == "buffer.groups[0].target_step: expected int, got 7.5 (treated as unknown)", hit.message
    assert_fires(rep, "CKD301", severity="warning")   # the other three groups are still judged


@needs_torch
@pytest.mark.parametrize("workers", [False, True])
def test_nemo_rl_dataloader_ahead_is_lost(nemo, workers):
    d = nemo(cursor=6, batches=8, workers=workers)
    rep = rec(d)
    assert_fires(rep, "CKD301", severity="error")
    hits = assert_fires(rep, "CKD303", severity="error", path_contains="train_dataloader.pt")
    ev = hits[0].details["evidence"]["dataloader.batches_in_epoch"]
    assert ev == ("train_dataloader.pt:_snapshot._snapshot_step + _steps_since_snapshot" if workers
                  else "train_dataloader.pt:_num_yielded")
    assert rep.facts["repair"] == {"available": True, "new_cursor": 7,
                                   "reason": "align the cursor to the dataloader: 6 -> 7"}


@needs_torch
def test_nemo_rl_reconcile_is_read_only(nemo):
    d = nemo(cursor=6, batches=8, status_step=9)
    root = os.path.dirname(d)
    before = _snapshot(root)
    rc, out, err = cli("reconcile", "--simulate", d)
    assert rc == 1
    assert _snapshot(root) == before


@needs_torch
def test_nemo_rl_fix_rewrites_only_the_cursor(nemo):
    d = nemo(cursor=6, batches=8)
    dl = open(os.path.join(d, "train_dataloader.pt"), "rb").read()
    info = json.load(open(os.path.join(d, "training_info.json")))
    rc, out, err = cli("reconcile", "--fix", d)
    assert rc == 0, (out, err)
    assert "lost on resume: 4 (p32, p33, p34, p35)" not in out  # the report is of the repaired state
    new = json.load(open(os.path.join(d, "training_info.json")))
    assert new == {**info, "sampler_dispatch_index": 7}
    assert open(os.path.join(d, "train_dataloader.pt"), "rb").read() == dl
    assert_no_errors(rec(d))


@needs_torch
def test_nemo_rl_fix_output_leaves_checkpoint_untouched(nemo, tmp_path):
    d = nemo(cursor=6, batches=8)
    before = _snapshot(d)
    out_file = tmp_path / "fixed_training_info.json"
    rc, out, err = cli("reconcile", "--fix", "--fix-output", str(out_file), d)
    assert rc == 1  # the checkpoint itself is still broken
    assert json.load(open(out_file))["sampler_dispatch_index"] == 7
    assert _snapshot(d) == before


@needs_torch
def test_nemo_rl_derived_cursor_cannot_be_fixed_in_place(nemo):
    d = nemo(cursor=None, batches=8)  # main / PR 3480: cursor rebuilt from trainer_version
    rep = rec(d)
    assert rep.facts["positions"]["cursor"] == 6
    hits = assert_fires(rep, "CKD303")
    assert hits[0].details["evidence"]["sampler.cursor"].startswith("derived")
    (cur,) = assert_fires(rep, "CKD301")   # a derived cursor lives in no file: the finding points at the checkpoint
    assert cur.path == d, (cur.path, d)
    rc, out, err = cli("reconcile", "--fix", d)
    assert rc == 2 and "derived" in err


@needs_torch
def test_nemo_rl_torn_data_plane_and_anchors(nemo):
    d = nemo(digest_ok=False, name="step_8")
    rep = rec(d)
    assert_fires(rep, "CKD308", severity="error", path_contains="data_plane/metadata.json")
    hits = assert_fires(rep, "CKD309")
    assert any("run.checkpoint_step = 8" in h.message for h in hits)


@needs_torch
def test_nemo_rl_status_pointer_and_leftovers_from_run_root(nemo):
    nemo(step=6, cursor=5, batches=6, targets=(6, 6, 6, 6))
    d = nemo(step=7, cursor=6, batches=7, status_step=9)
    os.rename(nemo(step=8, cursor=7, batches=8, targets=(8,) * 4), os.path.join(os.path.dirname(d), "tmp_step_8"))
    rep = rec(os.path.dirname(d))
    assert rep.facts["positions"]["trainer_version"] == 7  # the newest finished step_N
    hits = assert_fires(rep, "CKD311")
    assert any("step 9" in h.message for h in hits) and any("tmp_step_8" in h.path for h in hits)


@needs_torch
def test_nemo_rl_sampler_mismatch(nemo):
    rep = rec(nemo(saved_sampler="windowed"))
    assert_fires(rep, "CKD312", severity="error")


@needs_torch
def test_hostile_pickle_is_refused_and_never_run(nemo, tmp_path):
    import torch

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path}/pwned",))
    d = nemo()
    torch.save({"_num_yielded": Evil()}, os.path.join(d, "train_dataloader.pt"))
    rep = rec(d)
    hits = assert_fires(rep, "CKD313", path_contains="train_dataloader.pt")
    assert "posix.system" in hits[0].message or "os.system" in hits[0].message
    assert not (tmp_path / "pwned").exists()
    assert rep.facts["positions"]["dataloader_admitted"] is None  # unknown, not 0


@needs_torch
def test_truncated_pt_is_a_finding(nemo):
    d = nemo()
    p = os.path.join(d, "replay_buffer_metadata.pt")
    os.truncate(p, os.path.getsize(p) // 2)
    rep = rec(d)
    assert_fires(rep, "CKD313", path_contains="replay_buffer_metadata.pt")


@needs_torch
def test_show_state_and_map_override(nemo):
    d = nemo(cursor=6, batches=8, info_extra={"my_cursor": 7})
    rc, out, err = cli("reconcile", "--show-state", d)
    doc = json.loads(out)
    assert rc == 0 and doc["schema"] == "ckptdoctor.run_state/v1"
    assert doc["source"] == {"framework": "nemo-rl", "profile": "nemo-rl/sc-tq", "checkpoint": os.path.basename(d)}, \
        doc["source"]
    assert doc["sampler"]["cursor"] == 6 and doc["dataloader"]["batches_in_epoch"] == 8
    assert doc["provenance"]["sampler.cursor"] == "training_info.json:sampler_dispatch_index"
    rep = rec(d, maps=["sampler.cursor=training_info.json:my_cursor"])
    assert rep.facts["positions"]["cursor"] == 7
    assert "CKD303" not in rep.rules()
    rc, out, err = cli("reconcile", "--map", "nonsense", d)
    assert rc == 2 and "--map" in err


@needs_torch
def test_reconcile_needs_no_torch(nemo):
    d = nemo(cursor=6, batches=8)
    code = ("import sys; sys.modules['torch'] = None\n"
            "from ckptdoctor.cli import main; main(['reconcile', '--simulate', sys.argv[1]])")
    p = subprocess.run([sys.executable, "-c", code, d], capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    assert "CKD303" in p.stdout


@needs_torch
def test_fix_refuses_a_read_only_checkpoint(nemo):
    d = nemo(cursor=6, batches=8)
    before = _snapshot(d)
    os.chmod(d, 0o555)
    try:
        p = subprocess.run(as_unprivileged() + [sys.executable, "-m", "ckptdoctor", "reconcile", "--fix", d],
                           capture_output=True, text=True, timeout=120)
    finally:
        os.chmod(d, 0o755)
    assert p.returncode == 2 and "not writable" in p.stderr and "--fix-output" in p.stderr, p.stderr
    assert _snapshot(d) == before


@needs_torch
def test_object_store_checkpoint_reconciles_but_fix_needs_an_output(nemo):
    import fsspec
    from ckptdoctor.commands import reconcile as flow
    from ckptdoctor.engine.errors import UsageError
    d = nemo(cursor=6, batches=8)
    fsspec.filesystem("memory").put(d, "memory://rl/run/step_7", recursive=True)
    rep = api.reconcile("memory://rl/run/step_7")
    assert_fires(rep, "CKD303", path_contains="memory://rl/run/step_7/train_dataloader.pt")
    with pytest.raises(UsageError, match="--fix-output"):
        flow.fix(flow.load("memory://rl/run/step_7", None, []))


def test_a_later_epochs_dataloader_position_counts_every_earlier_epoch(tmp_path):
    """A state file that records the dataloader only within its epoch (epoch 2, 3 batches per
    epoch, k batches in) is judged at batch 2*3+k, exactly as if that total were recorded: k=1 is
    aligned with cursor 6 (a warning only), k=2 is a dataloader one batch ahead (an error)."""
    for in_epoch, severity in ((1, "warning"), (2, "error")):
        doc = state()
        del doc["dataloader"]["batches_total"]
        doc["trainer"]["epoch"] = 2
        doc["config"]["batches_per_epoch"] = 3
        doc["dataloader"]["batches_in_epoch"] = in_epoch
        got = rec(write_state(tmp_path, doc))
        explicit = rec(write_state(tmp_path, state(a=6 + in_epoch), name="explicit.json"))
        assert_fires(got, "CKD301", severity=severity)
        assert sorted((f.rule, f.severity) for f in got.findings) == \
            sorted((f.rule, f.severity) for f in explicit.findings), in_epoch


# ---- generated survivors of the runstate group's run (session 23) ----------------------------------
def test_prompt_ids_are_shown_as_one_range_when_contiguous_else_listed_up_to_eight():
    from ckptdoctor.checks.reconcile import _ids
    assert [_ids([]), _ids([4]), _ids([32, 33, 34, 35]), _ids([3, 4, 5]), _ids([4, 5])] == \
        ["none", "p4", "p32-p35", "p3-p5", "p4-p5"]
    assert _ids([1, 3, 5]) == "1, 3, 5"
    assert _ids(list(range(0, 20, 2))) == "0, 2, 4, 6, 8, 10, 12, 14, ..."


def test_a_dataloader_one_batch_ahead_names_the_lost_prompts_of_the_simulation(tmp_path):
    (hit,) = assert_fires(rec(write_state(tmp_path, state(c=6, a=8))), "CKD303", severity="error")
    assert hit.message.endswith("the next batch pulled (8) is stamped step 7, so 4 prompt(s) are skipped and never "
                                "trained (simulated: lost on resume p32-p35, lost at save none)"), hit.message
    assert hit.details["prompts_at_risk"] == 4


def test_an_aligned_state_with_an_odd_cursor_is_deduplication_not_loss(tmp_path):
    doc = state(c=7, a=8, targets=(8, 8, 8, 8))
    doc["trainer"].update(step=8, version=8)
    rep = rec(write_state(tmp_path, doc))
    (hit,) = assert_fires(rep, "CKD301", severity="warning")
    assert "the dataloader agrees with the cursor (batches_total 8)" in hit.message
    assert_no_errors(rep)


def test_a_dataloader_one_batch_behind_the_cursor_counts_one_batch_of_duplicates(tmp_path):
    (hit,) = assert_fires(rec(write_state(tmp_path, state(c=7, a=7, targets=(7,) * 4 + (8,) * 4))), "CKD303",
                          severity="warning")
    assert hit.message.startswith("dataloader is 1 batch(es) behind the sampler cursor (batches_total 7, cursor 7)")
    assert hit.details["prompts_at_risk"] == 4


@pytest.mark.parametrize("c,a,targets", [(6, 7, (7,) * 4), (7, 8, (7,) * 4 + (8,) * 4)])
def test_an_aligned_state_has_no_stall_no_waste_and_no_target_below_the_trainer(tmp_path, c, a, targets):
    """(Cursor 7: step 7 holds exactly its 4 groups.)"""
    rep = rec(write_state(tmp_path, state(c=c, a=a, targets=targets)))
    assert not {"CKD304", "CKD305"} & set(rep.rules()), [(f.rule, f.message) for f in rep.findings]
    (hit,) = assert_fires(rep, "CKD301", severity="warning")
    assert hit.details["targets_ahead"] == [c + 1] and hit.details["dropped_prompts"] == 4   # not the cursor's own step


def test_a_step_with_more_groups_than_slots_is_waste_not_a_stall(tmp_path):
    rep = rec(write_state(tmp_path, state(c=7, a=8, targets=(7,) * 5)))
    (hit,) = assert_fires(rep, "CKD304", severity="warning")
    assert hit.message == "step 7 has 5 groups for 4 slots: 1 will be evicted as waste"


@pytest.mark.parametrize("reserve,fires", [(36, False), (10, False), (37, True)])
def test_a_replace_mode_reserve_is_judged_against_the_prompts_pulled_beyond_the_cursor(tmp_path, reserve, fires):
    """batches_total 16, cursor 6, N=4: (16 - 7) * 4 = 36 prompts pulled beyond the cursor."""
    doc = state(c=6, a=16, reserve__prompts=reserve)
    doc["config"]["on_dropped_prompt"] = "replace"
    rep = rec(write_state(tmp_path, doc))
    if fires:
        (hit,) = assert_fires(rep, "CKD307", severity="warning")
        assert hit.message == ("replacement reserve holds 37 prompt(s), more than the 36 the dataloader pulled "
                               "beyond the cursor")
    else:
        assert "CKD307" not in rep.rules()


def test_a_replace_mode_reserve_with_the_dataloader_unknown_is_not_judged(tmp_path):
    doc = state(c=6, a=16, reserve__prompts=37)
    doc["config"]["on_dropped_prompt"] = "replace"
    del doc["dataloader"]
    assert "CKD307" not in rec(write_state(tmp_path, doc)).rules()


def test_the_simulation_trains_exactly_the_steps_asked_for():
    assert [t["step"] for t in _sim(6, 7, T7).trained] == [7, 8, 9, 10]
    assert [t["step"] for t in _sim(6, 7, T7, steps=2).trained] == [7, 8]


@pytest.mark.parametrize("latency,stalls", [(19, False), (20, True)])
def test_in_flight_groups_arrive_after_the_rollout_latency_and_twenty_idle_ticks_are_a_stall(latency, stalls):
    """Restored in-flight groups (rollout_recovery.pt) count only once generated: the trainer waits
    `latency` ticks for them, and 20 idle ticks (stall_ticks) make a stall."""
    from ckptdoctor.runstate.simulate import Restored
    pend = [Restored(7, f"inflight-{i}", ready=False) for i in range(4)]
    r = simulate(SimInput(4, 1, 7, 6, 7, pend, steps=1, latency=latency))
    assert (r.stalled_at == {"step": 7, "have": 4, "need": 4}) is stalls, r.stalled_at
    assert (r.trained == [{"step": 7, "restored": 4, "fresh": 0}]) is not stalls


def test_an_in_flight_group_below_the_trainer_is_evicted_only_once_it_completes():
    from ckptdoctor.runstate.simulate import Restored
    pend = [Restored(5, "late", ready=False)]
    assert simulate(SimInput(4, 1, 7, 6, 7, restored_with_ids(T7, 4) + pend, steps=1, latency=5)).evicted_prompts == []
    assert simulate(SimInput(4, 1, 7, 6, 7, restored_with_ids(T7, 4) + pend, steps=3, latency=1)).evicted_prompts == ["late"]


@pytest.mark.parametrize("c,a,targets,reason", [
    (7, 7, (7,) * 4 + (8,) * 4, "the dataloader is behind the cursor; that needs a dataloader rewind, which is never automated"),
    (8, 10, (9,) * 4, "cursor 9 would leave the gate window [6, 8]"),
    (3, 6, (4,) * 4 + (5,) * 4, "cursor 5 would leave the gate window [6, 8]"),   # below it: trainer 7 - 1
])
def test_no_repair_is_offered_and_the_reason_is_given(tmp_path, c, a, targets, reason):
    rep = rec(write_state(tmp_path, state(c=c, a=a, targets=targets)))
    assert rep.facts["repair"] == {"available": False, "new_cursor": None, "reason": reason}


@pytest.mark.parametrize("latency,stalls", [(20, False), (21, True)])
def test_the_idle_count_starts_again_after_each_trained_step(latency, stalls):
    """Step 7 trains at once (restored); step 8's fresh groups, dispatched at tick 0, arrive at tick
    `latency`: 19 idle ticks after step 7 are no stall, 20 are."""
    r = simulate(SimInput(4, 1, 7, 6, 7, restored_with_ids(T7, 4), steps=2, latency=latency))
    assert (r.stalled_at == {"step": 8, "have": 4, "need": 4}) is stalls, r.stalled_at


def test_a_provenance_naming_a_file_on_an_object_store_keeps_the_url_whole():
    from ckptdoctor.runstate.schema import Provenance
    assert Provenance.parse("s3://b/run/step_7/training_info.json:trainer.step") == \
        Provenance("file", "s3://b/run/step_7/training_info.json", "trainer.step")
    assert Provenance.parse("training_info.json:current_step") == Provenance("file", "training_info.json", "current_step")


def test_a_mapped_path_with_an_index_picks_that_element():
    from ckptdoctor.runstate.pathexpr import MISSING, get_path
    doc = {"groups": [{"step": 3}, {"step": 4}]}
    assert get_path(doc, "groups[1].step") == 4 and get_path(doc, "groups[2].step") is MISSING


def test_a_run_state_file_over_the_size_bound_is_a_one_line_error_naming_it(tmp_path, monkeypatch):
    from ckptdoctor.engine.errors import InputError
    from ckptdoctor.runstate import profiles
    path = write_state(tmp_path, state())
    monkeypatch.setattr(profiles, "MAX_JSON_BYTES", 100)
    with pytest.raises(InputError, match=rf"^{path}: larger than 100 bytes; not a run-state file$"):
        rec(path)


def test_a_stalled_step_hint_counts_what_lowering_the_cursor_costs(tmp_path):
    (hit,) = assert_fires(rec(write_state(tmp_path, state(c=7, a=8, targets=(7, 7)))), "CKD304", severity="error")
    assert hit.hint == ("lowering the cursor to 6 gap-fills but shifts every later stamp, costing 2 fresh prompt(s) "
                        "and 2 original(s); decide by hand")


def test_restored_targets_with_a_hole_name_the_missing_step(tmp_path):
    doc = state(c=8, a=9, targets=(7, 7, 7, 7, 9, 9, 9, 9))
    doc["config"]["max_lookahead_versions"] = 2
    hits = [h for h in assert_fires(rec(write_state(tmp_path, doc)), "CKD305") if "contiguous" in h.message]
    assert [(h.severity, h.details["missing"]) for h in hits] == [("warning", [8])]


def test_a_saved_sampler_other_than_the_configured_one_is_an_error_whichever_sorts_first(tmp_path):
    for saved, cfg in (("in_order", "windowed"), ("windowed", "in_order")):
        doc = state()
        doc["config"]["sampler"] = cfg
        doc["sampler"]["name"] = saved
        (hit,) = assert_fires(rec(write_state(tmp_path, doc)), "CKD312", severity="error")
        assert hit.message.startswith(f"checkpoint was saved with sampler {saved!r}, the config says {cfg!r}")


def test_a_mapped_expression_adds_and_subtracts_and_keys_of_any_case_are_fields():
    from ckptdoctor.runstate.pathexpr import evaluate, get_path
    assert evaluate({"a": 3, "b": 5}, "a + b") == 8 and evaluate({"a": 3, "b": 5}, "a - b") == -2
    assert get_path({"State": {"A": 5}}, "State.A") == 5


def test_a_one_character_file_name_in_a_provenance_is_a_file():
    from ckptdoctor.runstate.schema import Provenance
    assert Provenance.parse("x:trainer.step") == Provenance("file", "x", "trainer.step")


def test_id_less_restored_groups_take_the_prompts_of_their_batch_in_order():
    from ckptdoctor.runstate.simulate import restored_with_ids
    assert [r.prompt for r in restored_with_ids([(7, None)] * 3, 3)] == [21, 22, 23]
    assert [r.prompt for r in restored_with_ids([(7, None)] * 3, 3, diverted=1)] == [24, 25, 26]


@pytest.mark.parametrize("c,a,targets,new", [(5, 7, (6,) * 4 + (7,) * 4, 6), (6, 8, (7,) * 4, 7),
                                             (6, 9, (7,) * 4 + (8,) * 4, 8),
                                             (6, 10, (7,) * 4 + (8,) * 4 + (9,) * 4, None)])
def test_a_repair_is_offered_for_a_cursor_inside_the_gate_window_edges_included(tmp_path, c, a, targets, new):
    """Trainer 7, lookahead 1: the window is [6, 8], both edges offered; cursor 9 is refused."""
    rep = rec(write_state(tmp_path, state(c=c, a=a, targets=targets)))
    assert rep.facts["repair"]["available"] is (new is not None) and rep.facts["repair"]["new_cursor"] == new, \
        rep.facts["repair"]
    if new is not None:   # trainer 8: the window is [7, 9]
        rep = rec(write_state(tmp_path, state(c=c + 1, a=a + 1, targets=tuple(t + 1 for t in targets),
                                              trainer__step=8, trainer__version=8)))
        assert rep.facts["repair"]["new_cursor"] == new + 1, rep.facts["repair"]


def test_a_dataloader_ahead_of_an_odd_cursor_says_which_batch_the_cursor_expects(tmp_path):
    doc = state(c=7, a=9, targets=(8, 8, 8, 8))
    doc["trainer"].update(step=8, version=8)
    (hit,) = assert_fires(rec(write_state(tmp_path, doc)), "CKD301", severity="error")
    assert "the dataloader is ahead (batches_total 9 > cursor+1 = 8), so they are fresh prompts and are LOST" \
        in hit.message


@pytest.mark.parametrize("c,fires,why", [
    (5, True, "the next stamps fall below the trainer version"), (6, False, None), (8, False, None),
    (9, True, "the gate is already violated")])
def test_the_gate_window_is_trainer_minus_one_to_trainer_plus_lookahead_edges_included(tmp_path, c, fires, why):
    rep = rec(write_state(tmp_path, state(c=c, a=c + 1, targets=())))
    if not fires:
        assert "CKD302" not in rep.rules()
        return
    (hit,) = assert_fires(rep, "CKD302", severity="error")
    assert hit.message.startswith(f"sampler cursor {c} is outside the gate window [6, 8] (trainer version 7, "
                                  f"lookahead 1): {why}"), hit.message


def test_stale_groups_are_those_generated_before_trainer_minus_staleness(tmp_path):
    doc = state(targets=(8, 8, 8, 8))
    doc["trainer"].update(step=8, version=8)
    doc["config"].update(sampler="windowed", max_staleness_versions=2)
    for g, sv in zip(doc["buffer"]["groups"], (5, 5, 6, 7)):
        g["start_version"] = sv
    (hit,) = assert_fires(rec(write_state(tmp_path, doc)), "CKD306")
    assert hit.details["groups"] == 2
    assert hit.message.startswith("2 buffered group(s) were generated before version 6 (trainer 8, max staleness 2)")


def test_more_restored_groups_than_a_step_needs_dispatch_nothing_for_it():
    assert _row(_sim(6, 7, [(7, None)] * 5), 7) == (7, 0, 4, 4, 0)


def test_more_prompts_consumed_than_steps_times_batch_is_named_with_both_numbers(tmp_path):
    """More prompts consumed than 7 steps of 4 can hold is an inconsistency (CKD309); fewer is a run
    whose dropped prompts shrank some steps, and no finding."""
    rep = rec(write_state(tmp_path, state(trainer__consumed_prompts=40)))
    (hit,) = assert_fires(rep, "CKD309")
    assert hit.message == "consumed_prompts 40 exceeds num_prompts_per_step x step = 28"
    for fewer in (20, 28):
        assert "CKD309" not in rec(write_state(tmp_path, state(trainer__consumed_prompts=fewer))).rules()


def test_persisted_in_flight_groups_fill_their_step_in_the_simulated_repair(tmp_path):
    """Groups saved in flight (rollout recovery) are regenerated on resume and fill their target
    step: with step 8's four groups in flight and the dataloader one batch ahead, aligning the cursor
    to 8 loses nothing, and the repair is offered; an in-flight group with no target step counts for
    no step.  Left out of the simulation, step 8 would look empty and the repair be refused."""
    doc = state(c=7, a=9, targets=(7,) * 4)
    doc["inflight"] = {"persisted": True, "groups": [
        *({"target_step": 8, "status": "inflight", "size": 8, "start_version": 7} for _ in range(4)),
        {"status": "inflight", "size": 8}]}
    rep = rec(write_state(tmp_path, doc))
    assert rep.facts["repair"] == {"available": True, "new_cursor": 8,
                                   "reason": "align the cursor to the dataloader: 7 -> 8"}
    (hit,) = assert_fires(rep, "CKD303", severity="error")
    assert "lost on resume p36-p39" in hit.message and hit.details["repair"] == 8, hit.message


@pytest.mark.parametrize("groups, recorded, fires", [(4, 3, True), (4, 5, True), (4, 4, False), (300, 300, False),
                                                     (300, 299, True)])
def test_a_data_plane_recording_another_group_count_than_the_replay_file_is_an_error(tmp_path, groups, recorded,
                                                                                    fires):
    """CKD308: fewer or more groups recorded by the data plane than the replay file holds; equal
    counts (300 too: compared by value) are silent."""
    doc = state(targets=(7,) * groups, data_plane__group_count=recorded)
    hits = [f for f in rec(write_state(tmp_path, doc)).findings if f.rule == "CKD308"]
    assert bool(hits) is fires, [h.message for h in hits]
    if fires:
        assert_fires(rec(write_state(tmp_path, doc)), "CKD308", severity="error")
        assert hits[0].message == f"data plane records {recorded} replay group(s), the replay file holds {groups}"


def test_a_latest_status_naming_a_missing_step_shows_the_last_three_that_exist(tmp_path):
    doc = state(run__steps=[100, 200, 300, 400, 500], run__latest_status_step=600)
    (hit,) = assert_fires(rec(write_state(tmp_path, doc)), "CKD311")
    assert "names step 600, which does not exist as a finished step directory (have [300, 400, 500]): " in hit.message


@pytest.mark.parametrize("url", ["s3://b/run/step_7/info.json", "gcs://b/run/info.json", "s3a://b/info.json",
                                 "oss://b/info.json", "https://h/x/info.json", "hdfs://nn/info.json",
                                 "https://h/a", "file:///a"])
def test_a_provenance_naming_a_file_under_any_url_scheme_keeps_the_url_whole(url):
    """The field follows the first colon after the scheme's "://" -- a three-letter scheme (gcs,
    s3a, oss) included."""
    from ckptdoctor.runstate.schema import Provenance
    assert Provenance.parse(f"{url}:trainer.step") == Provenance("file", url, "trainer.step")


@pytest.mark.parametrize("b", [1.5, True, "x", None, [1]])
def test_a_mapped_sum_with_a_term_that_is_not_an_integer_is_unknown(b):
    from ckptdoctor.runstate.pathexpr import MISSING, evaluate
    assert evaluate({"a": 3, "b": b}, "a + b") is MISSING and evaluate({"a": 3, "b": b}, "b - a") is MISSING


@needs_torch
def test_id_less_groups_of_a_mapped_checkpoint_stay_id_less_not_the_string_none(nemo):
    """NeMo-RL's replay groups carry no prompt id: they stay unknown (None), which the simulation
    reads as "the prompts of their batch in order" -- never the id "None" shared by all."""
    d = nemo(cursor=6, batches=7)
    rc, out, err = cli("reconcile", "--show-state", d)
    groups = json.loads(out)["buffer"]["groups"]
    assert rc == 0 and len(groups) == 4 and all(g["prompt_id"] is None for g in groups), groups


@needs_torch
def test_a_status_file_whose_step_is_null_names_no_step(nemo):
    d = nemo(cursor=6, batches=7)
    with open(os.path.join(os.path.dirname(d), "latest_checkpoint_status.json"), "w") as fh:
        json.dump({"last_checkpoint_step": None}, fh)
    rc, out, err = cli("reconcile", "--show-state", os.path.dirname(d))
    doc = json.loads(out)
    assert rc == 0 and doc["run"].get("latest_status_step") is None, doc["run"]
    assert "run.latest_status_step" not in doc["provenance"], doc["provenance"]


@needs_torch
def test_a_mapped_field_with_a_malformed_expression_is_a_one_line_usage_error(nemo):
    d = nemo(cursor=6, batches=7)
    rc, out, err = cli("reconcile", "--map", "sampler.cursor=training_info.json:len(current_step", d)
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "field sampler.cursor" in err and "unclosed len(" in err, err


@pytest.mark.parametrize("mode", ["shrink", "drop", "skip"])
def test_a_reserve_under_any_mode_but_replace_is_an_error_whatever_the_mode_is_called(tmp_path, mode):
    """Only on_dropped_prompt 'replace' consumes the reserve; any other mode ('drop' sorts before
    'replace', 'skip' after) leaves its prompts unused."""
    doc = state(reserve__prompts=3)
    doc["config"]["on_dropped_prompt"] = mode
    (hit,) = assert_fires(rec(write_state(tmp_path, doc)), "CKD307", severity="error")
    assert hit.message.startswith(f"3 prompt(s) sit in the replacement reserve although on_dropped_prompt is {mode!r}")


def test_a_mapped_length_then_more_terms_and_a_quoted_literal_evaluate_in_full():
    from ckptdoctor.runstate.pathexpr import evaluate
    assert evaluate({"g": [1, 2, 3], "b": 4}, "len(g) + b") == 7 and evaluate({"g": [1, 2]}, "len(g) - 1") == 1
    assert evaluate({}, "'ready'") == "ready" and evaluate({}, "'in flight'") == "in flight"


def test_fields_of_unpickled_records_are_followed_like_dict_keys():
    """Profile paths reach into the records the safe unpickler builds (stand-ins with attributes),
    as NeMo-RL's replay groups are, not only into dicts."""
    from ckptdoctor.io.unpickle import Bag
    from ckptdoctor.runstate.pathexpr import MISSING, get_path
    b = Bag()
    b.__dict__.update(sample_ids=[1, 2], inner={"x": 3})
    assert get_path(b, "sample_ids") == [1, 2] and get_path(b, "inner.x") == 3 and get_path(b, "nope") is MISSING


def test_prompts_of_diverted_batches_count_as_consumed_before_the_resume():
    """With one batch diverted (its prompts handed to the reserve), batches below trainer + 1 are
    consumed: a wrong repair that pulls batch 7 again duplicates its prompts too."""
    r = simulate(SimInput(4, 1, 7, 7, 7, restored_with_ids(T7, 4, diverted=1), diverted=1))
    assert r.duplicate_prompts == [28, 29, 30, 31, 32, 33, 34, 35], r.duplicate_prompts


def test_more_ready_groups_than_a_step_needs_train_it_without_a_stall():
    r = _sim(6, 7, [(7, None)] * 5)
    assert r.trained[0] == {"step": 7, "restored": 4, "fresh": 0} and r.stalled_at is None


@pytest.mark.parametrize("n", [0, -4])
def test_no_prompts_per_step_is_refused_in_a_state_file_and_unknown_when_mapped(tmp_path, nemo, n):
    """A step of 0 or fewer prompts is no count: a run-state file saying so is a one-line error
    naming the field; a checkpoint's config saying so leaves it unknown (noted), so no rule and no
    repair divides by it."""
    from ckptdoctor.engine.errors import InputError
    doc = state(c=6, a=8)
    doc["config"]["num_prompts_per_step"] = n
    with pytest.raises(InputError, match=rf"config\.num_prompts_per_step: expected positive int, got {n}$"):
        rec(write_state(tmp_path, doc))
    d = nemo(cursor=6, batches=8)
    import yaml
    cfg = yaml.safe_load(open(os.path.join(d, "config.yaml")))
    cfg["grpo"]["num_prompts_per_step"] = n
    with open(os.path.join(d, "config.yaml"), "w") as fh:
        yaml.safe_dump(cfg, fh)
    rep = rec(d)
    assert rep.facts["repair"]["available"] is False and "a position is unknown (N," in rep.facts["repair"]["reason"], \
        rep.facts["repair"]


@pytest.mark.parametrize("source", ["derived (trainer.version - 1)", "derived(trainer.version - 1)", "saved"])
def test_a_cursor_source_with_its_formula_is_accepted(tmp_path, source):
    doc = state()
    doc["sampler"]["cursor_source"] = source
    rep = rec(write_state(tmp_path, doc))
    assert rep.facts["positions"]["cursor"] == 6


def test_a_map_override_without_a_file_name_is_a_usage_error(tmp_path):
    rc, out, err = cli("reconcile", "--map", "sampler.cursor=:current_step", write_state(tmp_path, state()))
    assert rc == 2 and "--map 'sampler.cursor=:current_step': expected FIELD=FILE:PATH" in err, err


def test_a_run_state_file_one_byte_past_64_mib_is_refused_unread(tmp_path):
    from ckptdoctor.engine.errors import InputError
    p = tmp_path / "state.json"
    with open(p, "wb") as fh:
        fh.truncate((64 << 20) + 1)
    with pytest.raises(InputError, match=rf"^{p}: larger than {64 << 20} bytes; not a run-state file$"):
        rec(str(p))


@needs_torch
def test_a_mapped_file_that_cannot_be_read_is_named_with_the_systems_reason(nemo):
    """CKD313: the file, and why in the system's words ("Permission denied"), not a Python repr."""
    d = nemo(cursor=6, batches=7)
    os.chmod(os.path.join(d, "training_info.json"), 0)
    p = subprocess.run(as_unprivileged() + [sys.executable, "-m", "ckptdoctor", "reconcile", "-f", "json", d],
                       capture_output=True, text=True, timeout=120)
    hits = [f for f in json.loads(p.stdout)["findings"] if f["rule"] == "CKD313"]
    assert [h["message"] for h in hits] == ["cannot read: Permission denied"], (hits, p.stderr)
    assert hits[0]["path"].endswith("training_info.json")


@pytest.mark.parametrize("expr", ["a $ b", "a + ?", "len(a", "(a)", "a +", "a + a -"])
def test_an_expression_that_cannot_be_parsed_is_a_path_error(expr):
    from ckptdoctor.runstate.pathexpr import PathError, evaluate
    with pytest.raises(PathError):
        evaluate({"a": [1]}, expr)


def test_a_parse_error_quotes_the_expression_from_where_it_stopped():
    from ckptdoctor.runstate.pathexpr import PathError, evaluate
    with pytest.raises(PathError, match=r"^cannot parse path expression '\$a \+ b' at '\$a \+ b'$"):
        evaluate({}, "$a + b")


def test_a_length_followed_directly_by_an_operator_is_evaluated_in_full():
    from ckptdoctor.runstate.pathexpr import evaluate
    assert evaluate({"g": [1, 2, 3], "b": 4}, "len(g)+b") == 7 and evaluate({"g": [1, 2, 3]}, "len(g)-1") == 2


def test_groups_restored_for_a_later_step_do_not_fill_an_earlier_one():
    """Step 7 has no restored group, step 8 has four: the pump dispatches a full batch for step 7."""
    r = _sim(6, 7, [(8, None)] * 4)
    assert _row(r, 7) == (7, 4, 0, 0, 0) and r.stalled_at is None


def test_a_rollout_latency_of_hundreds_of_ticks_still_completes_its_groups():
    r = simulate(SimInput(4, 1, 7, 6, 7, restored_with_ids(T7, 4), steps=3, latency=300, stall_ticks=1000))
    assert r.stalled_at is None and [t["step"] for t in r.trained] == [7, 8, 9], (r.stalled_at, r.trained)


def test_a_provenance_without_a_colon_is_a_whole_file():
    from ckptdoctor.runstate.schema import Provenance
    assert Provenance.parse("training_info.json") == Provenance("file", "training_info.json", None)


def test_a_shrink_mode_run_without_a_reserve_is_silent_even_with_the_dataloader_behind(tmp_path):
    doc = state(c=8, a=7, targets=(7,) * 4, reserve__prompts=0)
    doc["trainer"].update(step=8, version=8)
    assert "CKD307" not in rec(write_state(tmp_path, doc)).rules()


@pytest.mark.parametrize("c, said", [(6, True), (7, False), (8, False)])
def test_a_buffer_captured_after_the_cursor_is_noted_only_when_it_ran_ahead_of_it(tmp_path, c, said):
    """Separate awaits in the save path: a note only when the buffer holds targets past the cursor."""
    doc = state(c=c, a=c + 1, targets=(7,) * 4, capture__buffer_with_cursor=False)
    hits = [f for f in rec(write_state(tmp_path, doc)).findings if "captured after the cursor" in f.message]
    assert bool(hits) is said, [h.message for h in hits]


@needs_torch
def test_a_run_roots_steps_are_its_step_directories(nemo):
    nemo(step=6, cursor=5, batches=6, targets=(6,) * 4)
    d = nemo(step=7, cursor=6, batches=7, status_step=7)
    os.makedirs(os.path.join(os.path.dirname(d), "logs"))
    rc, out, err = cli("reconcile", "--show-state", os.path.dirname(d))
    doc = json.loads(out)
    assert doc["run"]["steps"] == [6, 7] and doc["run"]["latest_status_step"] == 7, doc["run"]
    assert "CKD311" not in {f.rule for f in rec(os.path.dirname(d)).findings}


def test_a_negative_number_where_a_term_is_expected_stays_negative():
    from ckptdoctor.runstate.pathexpr import evaluate
    assert evaluate({"a": 3}, "-1") == -1 and evaluate({"a": 3}, "a + -1") == 2 and evaluate({"a": 3}, "a - -1") == 4


def test_a_whole_float_for_an_integer_field_is_that_integer(tmp_path):
    """Some tools write every JSON number as a float: 7.0 for a step is step 7; 7.5 is refused."""
    from ckptdoctor.engine.errors import InputError
    doc = state()
    doc["trainer"]["version"] = 7.0
    doc["config"]["num_prompts_per_step"] = 4.0
    rep = rec(write_state(tmp_path, doc))
    assert rep.facts["positions"]["trainer_version"] == 7 and "CKD313" not in rep.rules()
    doc["trainer"]["version"] = 7.5
    with pytest.raises(InputError, match=r"trainer\.version: expected int, got 7\.5$"):
        rec(write_state(tmp_path, doc))


@needs_torch
@pytest.mark.parametrize("missing, source", [("sampler_dispatch_index", "derived"), ("trainer_version", "saved")])
def test_only_a_cursor_taken_from_its_fallback_is_marked_derived(nemo, missing, source):
    d = nemo(cursor=6, batches=7)
    p = os.path.join(d, "training_info.json")
    info = json.load(open(p))
    del info[missing]
    json.dump(info, open(p, "w"))
    rc, out, err = cli("reconcile", "--show-state", d)
    assert json.loads(out)["sampler"]["cursor_source"] == source, out


def _at8(**kw):
    doc = state(**kw)
    doc["trainer"].update(step=8, version=8)
    return doc


def test_positions_of_a_long_run_are_compared_by_value(tmp_path):
    """A cursor of 100,000 with the dataloader at 100,001 agrees (CKD301 says so, CKD303 is
    silent): positions past the interpreter's small-integer cache compare as numbers."""
    doc = state(c=100_000, a=100_001, targets=(100_001,) * 4)
    doc["trainer"].update(step=100_001, version=100_001)
    rep = rec(write_state(tmp_path, doc))
    (hit,) = assert_fires(rep, "CKD301", severity="warning")
    assert "the dataloader agrees with the cursor (batches_total 100001)" in hit.message, hit.message
    assert "CKD303" not in rep.rules()


def test_the_prompts_at_risk_count_batches_from_an_odd_cursor_either_way(tmp_path):
    """CKD303 counts batches between the dataloader and the cursor + 1, for an odd cursor too, and
    times them by the prompts per step (2 batches of 4 = 8 prompts)."""
    (hit,) = assert_fires(rec(write_state(tmp_path, _at8(c=7, a=10, targets=(8,) * 4))), "CKD303", severity="error")
    assert hit.message.startswith("dataloader is 2 batch(es) ahead of the sampler cursor (batches_total 10, cursor 7)"
                                  ": the next batch pulled (10) is stamped step 8, so 8 prompt(s) are skipped"), hit.message
    (hit,) = assert_fires(rec(write_state(tmp_path, _at8(c=9, a=8, targets=(8,) * 4))), "CKD303", severity="warning")
    assert hit.message.startswith("dataloader is 2 batch(es) behind the sampler cursor (batches_total 8, cursor 9): "
                                  "re-yielded batches get new stamps and their buffered twins (8 prompt(s))"), hit.message


def test_a_replace_mode_reserve_counts_the_prompts_pulled_beyond_an_odd_cursor(tmp_path):
    doc = _at8(c=7, a=16, targets=(8,) * 4, reserve__prompts=33)
    doc["config"]["on_dropped_prompt"] = "replace"
    (hit,) = assert_fires(rec(write_state(tmp_path, doc)), "CKD307", severity="warning")
    assert hit.message == "replacement reserve holds 33 prompt(s), more than the 32 the dataloader pulled beyond the cursor"


def test_targets_ahead_of_the_cursor_are_lost_only_when_the_dataloader_is_ahead(tmp_path):
    """CKD301: with the dataloader behind or level with the cursor the re-stamped prompts are
    duplicates (a warning), never "LOST"; one batch or more ahead of cursor + 1, they are lost (an
    error).  Behind is not called agreeing."""
    for a, said in ((6, "the dataloader is behind the cursor (cursor+1 = 7; "), (7, "the dataloader agrees with"),
                    (8, "are LOST")):
        doc = state(c=6, a=a, targets=(7,) * 4 + (8,) * 4)
        (hit,) = assert_fires(rec(write_state(tmp_path, doc)), "CKD301", severity="error" if a == 8 else "warning")
        assert said in hit.message, (a, hit.message)
    doc = _at8(c=7, a=7, targets=(8,) * 4 + (9,) * 4)   # an odd cursor: cursor+1 is 8
    (hit,) = assert_fires(rec(write_state(tmp_path, doc)), "CKD301", severity="warning")
    assert "the dataloader is behind the cursor (cursor+1 = 8; " in hit.message, hit.message


def test_a_group_size_mismatch_names_the_first_offending_group(tmp_path):
    doc = state()
    doc["buffer"]["groups"][1]["size"] = 6
    doc["buffer"]["groups"][3]["size"] = 5
    (hit,) = assert_fires(rec(write_state(tmp_path, doc)), "CKD312", severity="error")
    assert hit.message == "2 buffered group(s) have a size other than the configured group size 8 (e.g. 6)"
    doc = state()
    doc["buffer"]["groups"][2]["size"] = 16   # larger is as wrong as smaller
    (hit,) = assert_fires(rec(write_state(tmp_path, doc)), "CKD312", severity="error")
    assert hit.message == "1 buffered group(s) have a size other than the configured group size 8 (e.g. 16)"


def test_a_run_past_step_256_simulates_like_any_other():
    """Step numbers are compared by value: at trainer 1000 (past CPython's small-int cache) an
    aligned resume trains its restored step."""
    r = simulate(SimInput(4, 1, 1000, 999, 1000, restored_with_ids([(1000, None)] * 4, 4), steps=3))
    assert r.stalled_at is None and [t["step"] for t in r.trained] == [1000, 1001, 1002], r.stalled_at
    assert r.trained[0] == {"step": 1000, "restored": 4, "fresh": 0}


def test_a_repair_that_also_removes_duplicates_is_offered(tmp_path):
    """Cursor 6, dataloader 8, groups for steps 7 and 9: as saved, 8 prompts are lost and 4 trained
    twice; the cursor at 7 loses none and duplicates none -- fewer duplicates is no reason to refuse."""
    rep = rec(write_state(tmp_path, state(c=6, a=8, targets=(7,) * 4 + (9,) * 4)))
    assert rep.facts["repair"] == {"available": True, "new_cursor": 7,
                                   "reason": "align the cursor to the dataloader: 6 -> 7"}, rep.facts["repair"]


@pytest.mark.parametrize("d1, d2", [("0123456789abcdef" * 4, "fedcba9876543210" * 4),
                                    ("fedcba9876543210" * 4, "0123456789abcdef" * 4)])
def test_a_data_plane_digest_other_than_the_replay_files_is_an_error_either_way(tmp_path, d1, d2):
    """Both digests shown by their first 16 hex digits, either way round."""
    doc = state(data_plane__manifest_digest=d1, buffer__manifest_digest=d2)
    (hit,) = assert_fires(rec(write_state(tmp_path, doc)), "CKD308", severity="error")
    assert hit.message == (f"data-plane manifest digest {d1[:16]} differs from the replay file's {d2[:16]}: "
                           f"NeMo-RL refuses this resume"), hit.message


def test_an_unknown_capture_order_is_not_noted_as_a_buffer_captured_after_the_cursor(tmp_path):
    rep = rec(write_state(tmp_path, state(c=6, a=7, targets=(7,) * 4)))
    assert not [f for f in rep.findings if "captured after the cursor" in f.message]


@pytest.mark.parametrize("bie, said", [(7, True), (8, False), (6, False)])
def test_only_a_dataloader_saved_exactly_at_its_epochs_end_is_the_epoch_boundary_case(tmp_path, bie, said):
    doc = state()
    doc["config"]["batches_per_epoch"] = 7
    doc["dataloader"].update(batches_in_epoch=bie, iterator_finished=False)
    hits = [f for f in rec(write_state(tmp_path, doc)).findings if f.rule == "CKD310"]
    assert bool(hits) is said, [h.message for h in hits]


def test_in_flight_groups_keep_their_prompt_ids_in_the_simulation(tmp_path):
    """Persisted in-flight groups with prompt ids 28-31 (batch 7's): the dataloader's batch 7 is
    their duplicate, deduplicated, not lost."""
    doc = state(c=6, a=7, targets=())
    doc["inflight"] = {"persisted": True, "groups": [
        {"target_step": 7, "status": "inflight", "size": 8, "start_version": 6, "prompt_id": 28 + i} for i in range(4)]}
    sim = rec(write_state(tmp_path, doc), simulate=True).facts["simulation"]
    assert sim["lost_prompts"] == [] and sim["steps"][0] == {"step": 7, "batch": 7, "dispatched": 0, "dropped": 4,
                                                              "dedupe": 4, "lost": 0}, sim


def test_buffer_targets_below_the_cursor_are_not_ahead_of_it(tmp_path):
    rep = rec(write_state(tmp_path, _at8(c=8, a=9, targets=(7,) * 4)))
    assert "CKD301" not in rep.rules(), [(f.rule, f.message) for f in rep.findings]


@pytest.mark.parametrize("steps", [0, -3, 10_001])
def test_steps_to_simulate_outside_1_to_10000_are_refused_by_the_cli_and_the_api(tmp_path, steps):
    from ckptdoctor.engine.errors import UsageError
    path = write_state(tmp_path, state())
    with pytest.raises(UsageError, match=r"^--steps must be between 1 and 10000$"):
        api.reconcile(path, steps=steps)
    rc, out, err = cli("reconcile", path, "--steps", str(steps))
    assert rc == 2 and err.strip() == "ckptdoctor: --steps must be between 1 and 10000", err



def test_a_repair_that_would_stall_the_trainer_is_refused(tmp_path):
    """One batch diverted, cursor 6, dataloader 9: as saved, 4 prompts are lost; the cursor at 8
    loses none but leaves step 8 with no group at all -- a stall, so no repair is offered."""
    doc = state(c=6, a=9, targets=(7,) * 4, dataloader__diverted_batches=1)
    rep = rec(write_state(tmp_path, doc))
    assert rep.facts["repair"]["available"] is False and "or a stall" in rep.facts["repair"]["reason"]
    after = simulate(SimInput(4, 1, 7, 8, 9, restored_with_ids(T7, 4, diverted=1), diverted=1))
    assert after.stalled_at == {"step": 8, "have": 0, "need": 4} and after.lost_prompts == []


def test_a_state_files_groups_are_type_checked_like_its_fields(tmp_path):
    from ckptdoctor.engine.errors import InputError
    doc = state()
    doc["buffer"]["groups"][0]["target_step"] = 7.5
    with pytest.raises(InputError, match=r"buffer\.groups\[0\]\.target_step: expected int, got 7\.5$"):
        rec(write_state(tmp_path, doc))


def test_buffered_groups_with_the_trainer_step_unknown_are_not_judged_against_it(tmp_path):
    doc = state()
    doc["trainer"] = {"step": None, "version": None, "epoch": 0}
    rep = rec(write_state(tmp_path, doc))
    rules = rep.rules()
    assert "CKD305" not in rules and "CKD314" in rules and not {r for r in rules if r.startswith("CKD9")}, \
        [(f.rule, f.message) for f in rep.findings]   # CKD9xx: a rule that crashed


def test_a_stall_is_found_after_hundreds_of_idle_ticks_too():
    r = simulate(SimInput(4, 1, 7, 7, 8, restored_with_ids([(7, None)] * 2, 4), stall_ticks=300))
    assert r.stalled_at == {"step": 7, "have": 2, "need": 4}


def test_an_aligned_run_past_step_256_is_not_offered_a_repair(tmp_path):
    doc = state(c=999, a=1000, targets=(1000,) * 4)
    doc["trainer"].update(step=1000, version=1000)
    rep = rec(write_state(tmp_path, doc))
    assert rep.facts["repair"]["reason"] == "cursor and dataloader agree; raising the cursor would train a batch twice"


@pytest.mark.parametrize("mode, admitted", [("shrink", 7), ("drop", 7), ("replace", None)])
def test_only_replace_mode_needs_the_diverted_batches_to_place_the_dataloader(tmp_path, mode, admitted):
    """Without diverted_batches, any mode but 'replace' diverts nothing (admitted = batches_total);
    in replace mode the dataloader's position is unknown."""
    doc = state()
    doc["config"]["on_dropped_prompt"] = mode
    assert rec(write_state(tmp_path, doc)).facts["positions"]["dataloader_admitted"] == admitted


@pytest.mark.parametrize("given, shown", [(None, "saved"), ("derived", "derived")])
def test_a_state_files_cursor_without_a_source_is_a_saved_one_and_a_given_source_is_kept(tmp_path, given, shown):
    doc = state()
    doc["sampler"]["cursor_source"] = given
    rc, out, err = cli("reconcile", "--show-state", write_state(tmp_path, doc))
    assert rc == 0 and json.loads(out)["sampler"]["cursor_source"] == shown, out + err


def test_a_parsers_long_reason_is_cut_to_120_characters_on_its_one_line(tmp_path):
    """A run-state file the YAML parser refuses: the parser's reason, cut to 120 characters (a
    tag of 200 characters is quoted in PyYAML's reason), on the one line of the exit-2 error."""
    p = tmp_path / "state.yaml"
    p.write_text("schema: !" + "a" * 200 + " 1\n")
    rc, out, err = cli("reconcile", str(p))
    reason = "could not determine a constructor for the tag '!" + "a" * 200
    assert rc == 2 and f"not valid YAML: {reason[:120]}" in err and reason[:121] not in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_restored_in_flight_group_is_still_generating_when_the_first_step_trains(tmp_path):
    """A persisted in-flight group (rollout_recovery) is regenerated after the restart: stamped
    below the trainer (step 5 of trainer 7) it is evicted only once it completes, after the first
    simulated step, never as if it had been ready in the buffer at the restore."""
    doc = state(c=6, a=7)
    doc["inflight"] = {"persisted": True, "groups": [
        {"target_step": 5, "status": "inflight", "size": 8, "start_version": 4, "prompt_id": 99}]}
    path = write_state(tmp_path, doc)
    assert rec(path, simulate=True, steps=1).facts["simulation"]["evicted_prompts"] == []
    assert rec(path, simulate=True, steps=2).facts["simulation"]["evicted_prompts"] == [99]


def test_a_repair_is_refused_for_a_stall_it_adds_not_for_one_the_saved_state_has(tmp_path):
    """Cursor 7, dataloader 9, the buffer stamped for step 8 only: as saved the trainer waits for
    ever at step 7 (CKD304) and with the cursor at 8 it waits there too. The repair adds no stall,
    so it is offered for the loss it removes; the stall stays an error of its own."""
    rep = rec(write_state(tmp_path, state(c=7, a=9, targets=(8,) * 4)))
    assert rep.facts["repair"]["available"] is True and rep.facts["repair"]["new_cursor"] == 8, rep.facts["repair"]
    (hit,) = assert_fires(rep, "CKD304", severity="error")
    assert hit.message.startswith("step 7 has 0 of 4 groups"), hit.message


def test_one_buffered_group_ahead_of_the_cursor_is_enough_for_ckd301(tmp_path):
    """The newest restored target is any step holding at least one group: a single group stamped
    for step 8 beside a full step 7, cursor 7, is one dropped prompt, reported."""
    rep = rec(write_state(tmp_path, _at8(c=7, a=8, targets=(8,))))
    (hit,) = assert_fires(rep, "CKD301", severity="warning")   # the dataloader agrees: deduplicated, not lost
    assert hit.message.startswith("sampler cursor 7 is behind replay-buffer target step(s) 8 (1 group(s))"), hit.message


@needs_torch
def test_a_profile_whose_item_map_cannot_be_parsed_is_a_one_line_error_naming_the_field(nemo):
    """A profile's `map` for list items (buffer.groups' fields) is in the same path language: one
    that cannot be parsed is a usage error naming the profile and the item field, not a crash."""
    from ckptdoctor.engine.errors import UsageError
    from ckptdoctor.io.fs import LocalStorage
    from ckptdoctor.runstate import profiles as P
    d = nemo(cursor=6, batches=7)
    prof = P.detect(set(os.listdir(d)))
    fields = dict(prof.fields)
    fields["buffer.groups"] = dict(fields["buffer.groups"], map={**fields["buffer.groups"]["map"],
                                                                 "target_step": "len(target_step"})
    broken = P.Profile(prof.id, prof.framework, prof.title, prof.description, prof.priority, prof.detect_files,
                       prof.capture, fields)
    with pytest.raises(UsageError, match=rf"^profile {prof.id}: field buffer\.groups\.target_step: unclosed len\("):
        P.map_checkpoint(LocalStorage(str(d)), broken)


@pytest.mark.parametrize("expr", ["g[2]", "g[5]", "g[300]", "s[1]"])
def test_an_index_past_the_end_of_a_list_or_into_a_non_list_is_unknown_not_a_crash(expr):
    """A profile path like `groups[5]` on a file that holds two groups maps to nothing (the field
    is unknown), however far past the end the index is."""
    from ckptdoctor.runstate.pathexpr import MISSING, evaluate
    assert evaluate({"g": [1, 2], "s": "ab"}, expr) is MISSING
    assert evaluate({"g": list(range(400))}, "g[300]") == 300


@pytest.mark.parametrize("c, a, words, sev", [
    (6, 9, "so the prompts of 2 batch(es) (num_prompts_per_step unknown) are skipped and never trained", "error"),
    (8, 7, "their buffered twins (the prompts of 2 batch(es) (num_prompts_per_step unknown)) are trained twice",
     "warning")])
def test_a_cursor_dataloader_gap_with_the_prompt_count_unknown_counts_batches_not_zero_prompts(tmp_path, c, a, words, sev):
    """CKD303 with num_prompts_per_step unknown: the gap is stated in batches; it used to say
    "0 prompt(s)", which reads as harmless."""
    doc = state(c=c, a=a, targets=())
    del doc["config"]["num_prompts_per_step"]
    (hit,) = assert_fires(rec(write_state(tmp_path, doc)), "CKD303", severity=sev)
    assert words in hit.message and hit.details["prompts_at_risk"] is None, (hit.message, hit.details)
    doc["config"]["num_prompts_per_step"] = 4
    (hit,) = assert_fires(rec(write_state(tmp_path, doc)), "CKD303", severity=sev)
    assert hit.details["prompts_at_risk"] == 8 and "8 prompt(s)" in hit.message, hit.message


def test_a_short_step_says_which_cursor_would_gap_fill_it_and_at_what_cost(tmp_path):
    """CKD304 on step 8 holding 3 of 4 groups (cursor 8): the hint names cursor 7 and the cost in
    fresh and original prompts; the repair is left to a person."""
    (hit,) = assert_fires(rec(write_state(tmp_path, _at8(c=8, a=9, targets=(8,) * 3))), "CKD304", severity="error")
    assert hit.hint == ("lowering the cursor to 7 gap-fills but shifts every later stamp, costing 3 fresh "
                        "prompt(s) and 1 original(s); decide by hand"), hit.hint


@pytest.mark.parametrize("lookahead, cursor, stamped", [(1, 11, [7, 8, 9, 10, 11]), (2, 12, [7, 8, 9, 10, 11, 12])])
def test_the_simulated_sampler_runs_at_most_the_lookahead_ahead_of_the_trainer(tmp_path, lookahead, cursor, stamped):
    """Four steps from trainer 7 (cursor 6): the sampler stamps batches only while the cursor is
    below trainer + max_lookahead_versions, so it ends at 11 + lookahead - 1, never further."""
    doc = state(c=6, a=7)
    doc["config"]["max_lookahead_versions"] = lookahead
    sim = rec(write_state(tmp_path, doc), simulate=True, steps=4).facts["simulation"]
    assert sim["final"] == {"trainer": 11, "cursor": cursor, "admitted": cursor + 1}, sim["final"]
    assert [r["step"] for r in sim["steps"]] == stamped, sim["steps"]


@needs_torch
def test_a_fallback_that_cannot_be_computed_leaves_the_field_unknown_without_a_source(nemo):
    """training_info.json without the cursor, the trainer version and the step: the cursor's
    fallback (trainer.version - 1) and the version's (trainer.step) compute nothing, so both fields
    are unknown, with no provenance and no "derived" cursor source claimed for them."""
    d = nemo(cursor=6, batches=7)
    p = os.path.join(d, "training_info.json")
    info = json.load(open(p))
    for k in ("sampler_dispatch_index", "trainer_version", "current_step"):
        del info[k]
    json.dump(info, open(p, "w"))
    rc, out, err = cli("reconcile", "--show-state", d)
    doc = json.loads(out)
    assert doc["sampler"].get("cursor") is None and doc["sampler"].get("cursor_source") is None, doc["sampler"]
    assert doc["trainer"].get("version") is None, doc["trainer"]
    assert not {"sampler.cursor", "trainer.version"} & set(doc["provenance"]), doc["provenance"]


@needs_torch
def test_an_absent_optional_file_gives_its_fields_default_and_says_so(nemo):
    """No replacement_reserve.pt (nothing was pooled): reserve.prompts is the profile's default 0,
    and the provenance says the file was absent; with the file there its length counts."""
    d = nemo(cursor=6, batches=7)
    rc, out, err = cli("reconcile", "--show-state", d)
    doc = json.loads(out)
    assert doc["reserve"]["prompts"] == 0, doc["reserve"]
    assert doc["provenance"]["reserve.prompts"] == "default 0 (replacement_reserve.pt absent)", doc["provenance"]
    d = nemo(step=8, cursor=7, batches=8, targets=(8,) * 4, reserve=3)
    doc = json.loads(cli("reconcile", "--show-state", d)[1])
    assert doc["reserve"]["prompts"] == 3 and doc["provenance"]["reserve.prompts"] == "replacement_reserve.pt:len(.)"


def test_a_run_state_file_of_exactly_the_size_bound_is_read_and_one_byte_more_is_refused(tmp_path):
    """The bound is inclusive: a state file of MAX_JSON_BYTES (64 MiB, here mostly trailing
    spaces) is parsed; one byte more is the one-line "larger than" error."""
    from ckptdoctor.engine.errors import InputError
    from ckptdoctor.runstate.profiles import MAX_JSON_BYTES
    body = json.dumps(state()).encode()
    p = tmp_path / "state.json"
    p.write_bytes(body + b" " * (MAX_JSON_BYTES - len(body)))
    assert os.path.getsize(p) == MAX_JSON_BYTES
    assert rec(str(p)).facts["positions"]["cursor"] == 6
    with open(p, "ab") as fh:
        fh.write(b" ")
    with pytest.raises(InputError, match=rf"larger than {MAX_JSON_BYTES} bytes; not a run-state file$"):
        rec(str(p))


@pytest.mark.parametrize("unknown", ["sampler", "dataloader"])
def test_a_cursor_dataloader_comparison_needs_both_and_one_unknown_is_no_crash(tmp_path, unknown):
    """CKD303 compares the cursor with the dataloader: with either one unknown it says nothing (the
    unknown field is reported as such), and never crashes."""
    doc = state(c=6, a=9)
    if unknown == "sampler":
        del doc["sampler"]["cursor"]
    else:
        del doc["dataloader"]["batches_total"]
    rep = rec(write_state(tmp_path, doc))
    assert not {"CKD303", "CKD900"} & set(rep.rules()), [(f.rule, f.message) for f in rep.findings]


@needs_torch
def test_a_rollout_recovery_file_maps_its_groups_as_persisted_in_flight_groups(nemo):
    """NeMo-RL's rollout_recovery.pt holds the groups that were generating at the save: mapped
    into inflight.groups, marked persisted (so the simulation restores them) and shown as such."""
    import torch
    d = nemo(cursor=6, batches=7)
    torch.save({"groups": [{"group_id": f"g{i}", "target_step": 8, "prompt_id": 32 + i} for i in range(2)]},
               os.path.join(d, "rollout_recovery.pt"))
    doc = json.loads(cli("reconcile", "--show-state", d)[1])
    assert doc["inflight"]["persisted"] is True, doc["inflight"]
    assert [(g["target_step"], g["prompt_id"], g["status"]) for g in doc["inflight"]["groups"]] == \
        [(8, 32, "inflight"), (8, 33, "inflight")], doc["inflight"]
    assert doc["capture"] == {"cursor_with_dataloader": True, "buffer_with_cursor": False}, doc["capture"]


def test_a_recorded_batches_total_is_never_replaced_by_one_derived_from_the_epoch(tmp_path):
    """batches_total is derived from batches_in_epoch only when it is not recorded: a state file
    that records both keeps its own total (the epoch position does not overwrite it)."""
    doc = state(c=6, a=7)
    doc["dataloader"]["batches_in_epoch"] = 3
    assert rec(write_state(tmp_path, doc)).facts["positions"]["dataloader_admitted"] == 7
    del doc["dataloader"]["batches_total"]   # epoch 0: the total is the epoch's position
    assert rec(write_state(tmp_path, doc)).facts["positions"]["dataloader_admitted"] == 3


def test_a_late_run_whose_dataloader_agrees_with_its_cursor_has_no_gap(tmp_path):
    """Step numbers of real runs run into the thousands: cursor 2999 and dataloader 3000 agree
    (compared by value), so CKD303 says nothing."""
    doc = state(c=2999, a=3000, targets=(3000,) * 4)
    doc["trainer"].update(step=3000, version=3000)
    rep = rec(write_state(tmp_path, doc))
    assert "CKD303" not in rep.rules(), [(f.rule, f.message) for f in rep.findings]


@needs_torch
def test_a_config_without_a_key_takes_the_frameworks_default_and_says_so(nemo):
    """config.yaml present but without async_rl.sampler.max_lookahead_versions or
    rollout_failure.on_dropped_prompt: NeMo-RL's own defaults (1, shrink) apply, with a provenance
    naming the absent key."""
    import yaml
    d = nemo(cursor=6, batches=7, lookahead=3)
    p = os.path.join(d, "config.yaml")
    cfg = yaml.safe_load(open(p))
    del cfg["async_rl"]["sampler"]["max_lookahead_versions"]
    del cfg["async_rl"]["rollout_failure"]
    yaml.safe_dump(cfg, open(p, "w"))
    doc = json.loads(cli("reconcile", "--show-state", d)[1])
    assert doc["config"]["max_lookahead_versions"] == 1 and doc["config"]["on_dropped_prompt"] == "shrink", doc["config"]
    assert doc["provenance"]["config.max_lookahead_versions"] == \
        "default 1 (no async_rl.sampler.max_lookahead_versions in config.yaml)", doc["provenance"]


def test_with_one_prompt_per_step_an_empty_step_is_not_full(tmp_path):
    """num_prompts_per_step 1: a step holding no group is short like any other, so raising the
    cursor over it is refused as a stall."""
    doc = state(c=6, a=9, targets=(7,))
    doc["config"]["num_prompts_per_step"] = 1
    rep = rec(write_state(tmp_path, doc))
    assert rep.facts["repair"]["available"] is False and rep.facts["repair"]["reason"].startswith(
        "step(s) 8 in (6, 8] do not hold exactly 1 groups"), rep.facts["repair"]


@needs_torch
def test_a_value_the_config_states_is_never_replaced_by_the_frameworks_default(nemo):
    """async_rl.sampler.max_lookahead_versions: 3 in config.yaml is 3 (the default 1 is only for a
    config that lacks the key)."""
    d = nemo(cursor=6, batches=7, lookahead=3)
    doc = json.loads(cli("reconcile", "--show-state", d)[1])
    assert doc["config"]["max_lookahead_versions"] == 3, doc["config"]
    assert doc["provenance"]["config.max_lookahead_versions"] == "config.yaml:async_rl.sampler.max_lookahead_versions"


@needs_torch
def test_a_mapped_file_larger_than_the_bound_is_refused_by_its_listed_size_unread(nemo):
    """A checkpoint file the profile maps (config.yaml here) listed at 64 MiB + 10 bytes: refused
    from its size alone (CKD313 says how large and the limit), never read."""
    d = nemo(cursor=6, batches=7)
    os.truncate(os.path.join(d, "config.yaml"), (64 << 20) + 10)   # sparse: nothing to read in it
    hits = assert_fires(rec(d), "CKD313")
    assert any(h.message == "67108874 bytes is too large for a run-state file (limit 67108864)" for h in hits), \
        [h.message for h in hits]


def test_a_wrongly_typed_value_is_quoted_to_60_characters_in_its_one_line_error(tmp_path):
    """A run-state field of the wrong type: the error names the field and quotes the value as JSON,
    cut to 60 characters (a 200-character string stays one readable line)."""
    from ckptdoctor.engine.errors import InputError
    doc = state()
    doc["trainer"]["version"] = "v" * 200
    quoted = json.dumps("v" * 200)[:60]
    with pytest.raises(InputError, match=r"trainer\.version: expected int, got " + quoted + "$"):
        rec(write_state(tmp_path, doc))


def test_a_late_run_stall_counts_the_groups_its_step_holds(tmp_path):
    """Trainer 3000 with two of four groups for step 3000 and nothing more to come: the simulation
    stalls there and says it holds 2 (step numbers compared by value, as a long run has them)."""
    doc = state(c=3000, a=3001, targets=(3000, 3000))
    doc["trainer"].update(step=3000, version=3000)
    sim = rec(write_state(tmp_path, doc), simulate=True, steps=1).facts["simulation"]
    assert sim["stalled_at"] == {"step": 3000, "have": 2, "need": 4}, sim["stalled_at"]
