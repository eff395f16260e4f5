"""verify, part 2: Hugging Face safetensors and Trainer, DeepSpeed, verl, NeMo-RL, Orbax layouts,
built with the real libraries (safetensors, huggingface_hub, torch.save) or with the exact files
those libraries write (formats.md), broken one way per rule."""
import json
import os
import shutil
import struct

import pytest

from ckptdoctor import api
from conftest import needs_torch
from helpers import assert_fires, assert_no_errors

torch = pytest.importorskip("torch")


def sd(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {f"model.layers.{i}.mlp.weight": torch.randn(16, 16, generator=g) for i in range(n)}


# ---- Hugging Face safetensors --------------------------------------------------------------------
@pytest.fixture
def hf_sharded(tmp_path):
    from huggingface_hub import save_torch_state_dict
    d = tmp_path / "hf"
    d.mkdir()
    save_torch_state_dict(sd(), str(d), max_shard_size="3KB")
    assert (d / "model.safetensors.index.json").exists() and len(list(d.glob("*.safetensors"))) > 2
    return d


def test_hf_sharded_healthy(hf_sharded):
    rep = api.verify(str(hf_sharded))
    assert rep.facts["layout"] == "hf-safetensors"
    assert_no_errors(rep)
    assert not rep.findings


def test_truncated_shard_caught_from_header(hf_sharded):
    shard = sorted(hf_sharded.glob("model-*.safetensors"))[1]
    os.truncate(shard, shard.stat().st_size - 100)
    rep = api.verify(str(hf_sharded))
    hits = assert_fires(rep, "CKD120", path_contains=shard.name)
    assert "truncated" in hits[0].message


@pytest.mark.parametrize("corrupt, words", [
    (lambda b: struct.pack("<Q", 1 << 40) + b[8:], "exceeds"),
    (lambda b: struct.pack("<Q", len(b)) + b[8:], "runs past the end"),
    (lambda b: b[:8] + b"\xff" + b[9:], "UTF-8"),
    (lambda b: b + b"junk", "trailing bytes"),
    (lambda b: b[:8] + b[8:].replace(b'"F32"', b'"F16"', 1), "needs"),
])
def test_header_rules(tmp_path, corrupt, words):
    from safetensors.torch import save_file
    d = tmp_path / "single"
    d.mkdir()
    save_file(sd(2), str(d / "model.safetensors"))
    p = d / "model.safetensors"
    p.write_bytes(corrupt(p.read_bytes()))
    rep = api.verify(str(d))
    hits = assert_fires(rep, "CKD120")
    assert words in hits[0].message, hits[0].message


def test_index_cross_check(hf_sharded):
    idx = json.loads((hf_sharded / "model.safetensors.index.json").read_text())
    shards = sorted(set(idx["weight_map"].values()))
    os.remove(hf_sharded / shards[-1])
    rep = api.verify(str(hf_sharded))
    hits = assert_fires(rep, "CKD121", path_contains=shards[-1], severity="error")
    n = sum(1 for v in idx["weight_map"].values() if v == shards[-1])
    assert n >= 2 and hits[0].message == (f"shard {shards[-1]} named by model.safetensors.index.json is missing "
                                          f"({n} tensors)"), hits[0].message


def test_tensors_in_other_shards_than_the_index_says_are_counted_and_the_first_named(hf_sharded):
    """Two tensors the index places in another shard: one finding counts both and names the first
    one found, in shard order."""
    p = hf_sharded / "model.safetensors.index.json"
    idx = json.loads(p.read_text())
    shards = sorted(set(idx["weight_map"].values()))
    first = sorted(t for t, s in idx["weight_map"].items() if s == shards[0])[0]
    last = sorted(t for t, s in idx["weight_map"].items() if s == shards[-1])[0]
    idx["weight_map"][first], idx["weight_map"][last] = shards[-1], shards[0]
    p.write_text(json.dumps(idx))
    hits = [h for h in assert_fires(api.verify(str(hf_sharded)), "CKD121") if "different shard" in h.message]
    assert len(hits) == 1 and hits[0].message.startswith("2 tensor(s) live in a different shard"), hits
    assert hits[0].details == {"tensor": first, "in": shards[0], "index": shards[-1]}, hits[0].details


def test_tensors_the_index_maps_to_a_shard_that_lacks_them_are_all_counted(hf_sharded):
    p = hf_sharded / "model.safetensors.index.json"
    idx = json.loads(p.read_text())
    first = sorted(set(idx["weight_map"].values()))[0]
    idx["weight_map"].update({"ghost.a": first, "ghost.b": first})
    p.write_text(json.dumps(idx))
    hits = [h for h in assert_fires(api.verify(str(hf_sharded)), "CKD121", path_contains=first, severity="error")
            if "not in its header" in h.message]
    assert len(hits) == 1 and hits[0].message.startswith(f"2 tensor(s) mapped to {first} by "), hits
    assert hits[0].details["tensors"] == ["ghost.a", "ghost.b"], hits[0].details


def test_an_index_of_exactly_256_mib_is_read_whole(hf_sharded):
    """The index bound is 256 MiB, inclusive: an index padded to exactly that size is parsed and
    judged (here: healthy), not refused as too large."""
    p = hf_sharded / "model.safetensors.index.json"
    text = p.read_text()
    p.write_text(text + " " * ((256 << 20) - len(text.encode())))
    assert p.stat().st_size == 256 << 20
    rep = api.verify(str(hf_sharded))
    assert not [f for f in rep.findings if "index.json" in f.path], [(f.rule, f.message[:80]) for f in rep.findings]


def test_index_maps_tensor_to_wrong_shard(hf_sharded):
    p = hf_sharded / "model.safetensors.index.json"
    idx = json.loads(p.read_text())
    t = sorted(idx["weight_map"])[0]
    other = next(s for s in sorted(set(idx["weight_map"].values())) if s != idx["weight_map"][t])
    idx["weight_map"][t] = other
    p.write_text(json.dumps(idx))
    msgs = " ".join(h.message for h in assert_fires(api.verify(str(hf_sharded)), "CKD121"))
    assert "not in its header" in msgs and "different shard" in msgs


@pytest.mark.parametrize("delta", [-1, 1])
def test_an_index_total_size_other_than_the_shards_bytes_is_a_warning_either_way(hf_sharded, delta):
    """metadata.total_size one byte under or over what the shards hold: a warning (tied weights can
    explain it), stated with both numbers."""
    p = hf_sharded / "model.safetensors.index.json"
    idx = json.loads(p.read_text())
    true_total = idx["metadata"]["total_size"]
    idx["metadata"]["total_size"] = true_total + delta
    p.write_text(json.dumps(idx))
    (hit,) = assert_fires(api.verify(str(hf_sharded)), "CKD121", path_contains="index.json", severity="warning")
    assert hit.message == f"metadata.total_size is {true_total + delta} but the shards hold {true_total} tensor bytes"


def test_a_shard_the_index_does_not_name_is_a_warning_naming_it(hf_sharded):
    import shutil
    idx = json.loads((hf_sharded / "model.safetensors.index.json").read_text())
    first = sorted(set(idx["weight_map"].values()))[0]
    shutil.copy(hf_sharded / first, hf_sharded / "model-00099-of-00099.safetensors")
    hits = assert_fires(api.verify(str(hf_sharded)), "CKD121", path_contains="model-00099-of-00099.safetensors",
                        severity="warning")
    assert hits[0].message == "model-00099-of-00099.safetensors is not referenced by model.safetensors.index.json"


# ---- HF Trainer ------------------------------------------------------------------------------------
def trainer_ckpt(d, step, optimizer=True):
    from safetensors.torch import save_file
    d.mkdir(parents=True)
    save_file(sd(2, step), str(d / "model.safetensors"))
    if optimizer:
        torch.save({"state": {}, "param_groups": [{"lr": 1e-4}]}, d / "optimizer.pt")
        torch.save({"last_epoch": step}, d / "scheduler.pt")
    torch.save({"python": 1, "cpu": torch.get_rng_state()}, d / "rng_state.pth")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))


@pytest.mark.parametrize("names, warned", [
    (("rng_state_0.pth", "rng_state_1.pth"), None),      # a healthy two-process run
    (("rng_state_0.pth",), "1 of 2 per-process RNG files missing: rng_state_1.pth"),
])
def test_per_process_rng_files_are_counted_against_the_run_and_a_full_set_is_no_finding(tmp_path, names, warned):
    """transformers' Trainer writes rng_state_{process}.pth per process of a multi-process run: a
    checkpoint holding as many as its siblings is healthy (no warning at all); one short of them
    is a warning naming the missing file."""
    run = tmp_path / "out"
    for s, files in ((500, ("rng_state_0.pth", "rng_state_1.pth")), (1000, names)):
        trainer_ckpt(run / f"checkpoint-{s}", s)
        os.remove(run / f"checkpoint-{s}" / "rng_state.pth")
        for n in files:
            torch.save({"python": 1, "cpu": torch.get_rng_state()}, run / f"checkpoint-{s}" / n)
    rep = api.verify(str(run))
    rng = [f for f in rep.findings if "RNG" in f.message]
    if warned is None:
        assert not rng, [(f.rule, f.message) for f in rng]
    else:
        assert [(f.severity, f.message) for f in rng] == [("warning", warned)], [(f.rule, f.message) for f in rng]


def test_a_checkpoints_own_highest_rng_file_counts_its_processes_without_a_sibling(tmp_path):
    """Alone in its run, a checkpoint holding rng_state_0, _1 and _3 was written by 4 processes:
    process 2's file is missing ("1 of 4")."""
    run = tmp_path / "out"
    trainer_ckpt(run / "checkpoint-1000", 1000)
    os.remove(run / "checkpoint-1000" / "rng_state.pth")
    for r in (0, 1, 3):
        torch.save({"python": 1, "cpu": torch.get_rng_state()}, run / "checkpoint-1000" / f"rng_state_{r}.pth")
    (hit,) = [f for f in api.verify(str(run)).findings if "RNG" in f.message]
    assert (hit.severity, hit.message) == ("warning", "1 of 4 per-process RNG files missing: rng_state_2.pth")


def test_a_single_process_rng_file_is_a_whole_set_beside_a_sibling_with_only_process_0s(tmp_path):
    """rng_state.pth (what Trainer writes when the world is one process) next to a sibling holding
    only rng_state_0.pth: one process each, nothing missing, no RNG warning."""
    run = tmp_path / "out"
    trainer_ckpt(run / "checkpoint-500", 500)
    os.rename(run / "checkpoint-500" / "rng_state.pth", run / "checkpoint-500" / "rng_state_0.pth")
    trainer_ckpt(run / "checkpoint-1000", 1000)
    rep = api.verify(str(run))
    assert not [f for f in rep.findings if "RNG" in f.message], [(f.rule, f.message) for f in rep.findings]


def test_a_staging_leftover_that_cannot_be_listed_is_still_reported_with_its_size_unknown(tmp_path, monkeypatch):
    """CKD124 sums a staging directory's bytes from its listing; when that listing fails (a
    permission, a directory deleted meanwhile) the leftover is still reported, its size unknown."""
    from ckptdoctor.io import fs
    run = tmp_path / "out"
    trainer_ckpt(run / "checkpoint-500", 500)
    trainer_ckpt(run / "tmp-checkpoint-1000", 1000)
    real = fs.LocalStorage.listdir

    def listdir(self, rel=""):
        if rel.endswith("tmp-checkpoint-1000"):
            raise PermissionError(13, "Permission denied")
        return real(self, rel)
    monkeypatch.setattr(fs.LocalStorage, "listdir", listdir)
    (hit,) = assert_fires(api.verify(str(run)), "CKD124", path_contains="tmp-checkpoint-1000", severity="warning")
    assert hit.details["bytes"] is None and hit.details["dir"] == "tmp-checkpoint-1000", hit.details


def test_a_trainer_state_json_of_many_kilobytes_is_read_whole(tmp_path):
    """trainer_state.json grows with log_history (hundreds of KB in long runs): one of ~200 KB parses,
    and its global_step is checked like a small one's."""
    run = tmp_path / "out"
    trainer_ckpt(run / "checkpoint-500", 500)
    p = run / "checkpoint-500" / "trainer_state.json"
    p.write_text(json.dumps({"global_step": 500, "log_history": [{"loss": 0.5, "step": i} for i in range(8000)]}))
    assert os.path.getsize(p) > 100_000
    rep = api.verify(str(run))
    assert "CKD126" not in rep.rules() and rep.facts["resume_from"] == "checkpoint-500", rep.findings
    p.write_text(json.dumps({"global_step": 499, "log_history": [{"loss": 0.5, "step": i} for i in range(8000)]}))
    assert_fires(api.verify(str(run)), "CKD126", path_contains="trainer_state.json", severity="error")


@pytest.mark.parametrize("content, said", [
    ({"global_step": 501}, "trainer_state.json says global_step 501, but the directory is checkpoint-500"),
    ("[" * 200_000 + "]" * 200_000, None),
])
def test_a_trainer_state_ahead_of_its_directory_or_nested_past_the_parser_is_an_error(tmp_path, content, said):
    """global_step above the directory's step is as wrong as below it; a trainer_state.json nested
    past the parser's recursion limit is "not valid JSON", quoting the parser to 80 characters."""
    run = tmp_path / "out"
    trainer_ckpt(run / "checkpoint-500", 500)
    p = run / "checkpoint-500" / "trainer_state.json"
    p.write_text(content if isinstance(content, str) else json.dumps(content))
    (hit,) = assert_fires(api.verify(str(run)), "CKD126", path_contains="trainer_state.json", severity="error")
    if said is None:
        try:
            json.loads(content)
        except RecursionError as exc:
            said = f"trainer_state.json is not valid JSON ({str(exc)[:80]}): the framework cannot resume"
    assert hit.message.startswith(said), hit.message


def test_hf_trainer_run(tmp_path):
    run = tmp_path / "out"
    for s in (500, 1000):
        trainer_ckpt(run / f"checkpoint-{s}", s)
    rep = api.verify(str(run))
    assert rep.facts["layout"] == "hf-trainer-run" and rep.facts["resume_from"] == "checkpoint-1000"
    assert_no_errors(rep)
    trainer_ckpt(run / "tmp-checkpoint-1500", 1500)             # staging, died
    trainer_ckpt(run / "checkpoint-2000", 2000, optimizer=False)
    os.remove(run / "checkpoint-2000" / "trainer_state.json")  # killed before the last write
    rep = api.verify(str(run))
    assert_fires(rep, "CKD124", path_contains="tmp-checkpoint-1500", severity="warning")
    assert_fires(rep, "CKD123", path_contains="checkpoint-2000/trainer_state.json")
    assert_fires(rep, "CKD101", path_contains="checkpoint-2000")
    assert rep.facts["resume_from"] == "checkpoint-2000" and rep.facts["newest_complete"] == "checkpoint-1000"


# ---- DeepSpeed -------------------------------------------------------------------------------------
def ds_tag(d, dp=4, mp=1, step=3):
    d.mkdir(parents=True)
    for m in range(mp):
        torch.save({"module": sd(1), "global_steps": step, "dp_world_size": dp, "mp_world_size": mp},
                   d / f"mp_rank_{m:02d}_model_states.pt")
        for r in range(dp):
            torch.save({"optimizer_state_dict": {"zero_stage": 2, "partition_count": [dp]}},
                       d / f"bf16_zero_pp_rank_{r}_mp_rank_{m:02d}_optim_states.pt")


def test_deepspeed_rank_grid(tmp_path):
    run = tmp_path / "ds"
    ds_tag(run / "global_step3", dp=4, mp=2)
    (run / "latest").write_text("global_step3")
    rep = api.verify(str(run))
    assert rep.facts["layout"] == "deepspeed-run" and rep.facts["resume_from"] == "global_step3"
    assert_no_errors(rep)
    os.remove(run / "global_step3" / "bf16_zero_pp_rank_2_mp_rank_01_optim_states.pt")
    open(run / "global_step3" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "w").close()
    rep = api.verify(str(run))
    msgs = [h.message for h in assert_fires(rep, "CKD122")]
    assert any("model-parallel rank 1" in m and "rank(s) 2 missing" in m for m in msgs)
    assert any("bf16_zero_pp_rank_2_mp_rank_01_optim_states.pt" in m for m in msgs)  # the file is named
    assert any("empty" in m for m in msgs)
    assert rep.facts["newest_complete"] is None
    (run / "latest").write_text("global_step9")
    assert_fires(api.verify(str(run)), "CKD113")


def test_a_deepspeed_run_without_its_latest_file_is_told_to_write_the_tag_not_to_link(tmp_path):
    """DeepSpeed's `latest` holds the tag (global_step3), written as text: the advice for a missing one
    names that content and never suggests the symbolic link Composer's tracker is."""
    run = tmp_path / "ds"
    ds_tag(run / "global_step3", dp=2, mp=1)
    rep = api.verify(str(run))
    hit = assert_fires(rep, "CKD111", severity="error")[0]
    assert hit.details["newest_complete"] == "global_step3"
    assert "write 'global_step3' into latest (temp file + rename)" in hit.hint, hit.hint
    assert "ln -s" not in hit.hint and rep.facts["resume_from"] is None
    (run / "latest").write_text("../elsewhere/global_step3")       # a tag that is a path: unparsable
    hit = assert_fires(api.verify(str(run)), "CKD112", severity="error")[0]
    assert "rewrite it to name a complete checkpoint" in hit.hint and "link" not in hit.hint, hit.hint


@pytest.mark.parametrize("recorded", [None, -4, 0, True, 1 << 21])
def test_a_deepspeed_world_not_recorded_is_counted_from_the_highest_rank_file_there(tmp_path, recorded):
    """Model-states files that record neither dp_world_size nor mp_world_size (an older save), or
    record a world no job has (negative, zero, a bool, past 2**20): each world is the highest rank
    with a file, plus one, so the last model-parallel rank is judged and one partition missing in
    the middle of it is "3 of 4"."""
    run = tmp_path / "ds"
    ds_tag(run / "global_step3", dp=4, mp=2)
    worlds = {} if recorded is None else {"dp_world_size": recorded, "mp_world_size": recorded}
    for m in (0, 1):   # neither model-states file records a usable world
        torch.save({"module": sd(1), "global_steps": 3, **worlds},
                   run / "global_step3" / f"mp_rank_{m:02d}_model_states.pt")
    (run / "latest").write_text("global_step3")
    os.remove(run / "global_step3" / "bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt")
    (hit,) = assert_fires(api.verify(str(run)), "CKD122", severity="error")
    assert hit.message == ("model-parallel rank 1: ZeRO optim files of data-parallel rank(s) 1 missing "
                           "(have 3 of 4): bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt"), hit.message
    assert hit.details["dp_world"] == 4 and hit.details["missing_dp"] == [1] and hit.details["mp"] == 1, hit.details


def test_three_model_parallel_ranks_not_recorded_are_three_not_four(tmp_path):
    """A tag of three model-parallel ranks whose files record no world: the world is the highest
    rank there plus one (3), so nothing is missing -- not a fourth rank invented."""
    run = tmp_path / "ds"
    ds_tag(run / "global_step3", dp=2, mp=3)
    for m in range(3):
        torch.save({"module": sd(1), "global_steps": 3}, run / "global_step3" / f"mp_rank_{m:02d}_model_states.pt")
    (run / "latest").write_text("global_step3")
    assert "CKD122" not in api.verify(str(run)).rules()
    os.remove(run / "global_step3" / "mp_rank_02_model_states.pt")   # the highest rank's own file: still counted
    (hit,) = assert_fires(api.verify(str(run)), "CKD122", path_contains="mp_rank_02_model_states.pt", severity="error")


def _missing_optim_partitions(tmp_path, dp: int, first: int):
    """A ZeRO tag of `dp` partitions with ranks first..dp-1's optimizer files removed: (CKD122's hit, removed)."""
    run = tmp_path / "ds"
    ds_tag(run / "global_step3", dp=dp, mp=1)
    (run / "latest").write_text("global_step3")
    gone = [f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(first, dp)]
    for f in gone:
        os.remove(run / "global_step3" / f)
    (hit,) = assert_fires(api.verify(str(run)), "CKD122", severity="error")
    return hit, gone


@pytest.mark.parametrize("dp, more", [(6, ""), (8, " and 2 more")])
def test_missing_rank_files_are_named_up_to_five_and_the_rest_counted(tmp_path, dp, more):
    """Five missing ZeRO optimizer partitions are all named, without a count; seven: the first five
    and "and 2 more". The details keep every one."""
    hit, gone = _missing_optim_partitions(tmp_path, dp, 1)
    assert hit.message.endswith(": " + ", ".join(gone[:5]) + more), hit.message
    assert hit.details["missing_files"] == gone, hit.details


def test_the_missing_rank_files_of_a_large_job_are_kept_to_the_first_100_and_all_counted(tmp_path):
    """102 of 104 ZeRO partitions missing: the details list the first 100 file names (a bounded
    report), the missing ranks every one."""
    hit, gone = _missing_optim_partitions(tmp_path, 104, 2)
    assert hit.details["missing_files"] == gone[:100] and hit.details["missing_dp"] == list(range(2, 104)), hit.details


# ---- verl --------------------------------------------------------------------------------------------
def verl_step(d, step, world=2):
    for comp in ("actor", "critic"):
        (d / comp).mkdir(parents=True)
        for r in range(world):
            for kind in ("model", "optim", "extra_state"):
                torch.save({"rank": r}, d / comp / f"{kind}_world_size_{world}_rank_{r}.pt")
        (d / comp / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world}))
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fixtures"))
    from nemo_rl_ckpt import dataloader_state  # the real torchdata StatefulDataLoader state
    torch.save(dataloader_state(2), d / "data.pt")


def test_verl_run(tmp_path):
    run = tmp_path / "verl"
    for s in (20, 40):
        verl_step(run / f"global_step_{s}", s)
    (run / "latest_checkpointed_iteration.txt").write_text("40")
    rep = api.verify(str(run))
    assert rep.facts["layout"] == "verl-run" and rep.facts["resume_from"] == "global_step_40"
    assert_no_errors(rep)
    os.remove(run / "global_step_40" / "data.pt")
    os.remove(run / "global_step_40" / "actor" / "optim_world_size_2_rank_1.pt")
    shutil.rmtree(run / "global_step_20" / "actor")  # rotation leaves global_step_20 with critic + data.pt
    rep = api.verify(str(run))
    assert_fires(rep, "CKD123", path_contains="global_step_40/data.pt")
    hits = assert_fires(rep, "CKD122", path_contains="global_step_40/actor")
    assert hits[0].details["missing_ranks"] == [1] and hits[0].details["kind"] == "optim"
    assert hits[0].details["missing_files"] == ["actor/optim_world_size_2_rank_1.pt"]
    assert "actor/optim_world_size_2_rank_1.pt" in hits[0].message


def test_verl_rank_files_missing_from_a_large_world_are_listed_to_the_first_100(tmp_path):
    """An actor of world size 104 with only ranks 0 and 1 on disk: CKD122 counts all 102 missing
    ranks and lists the first 100 file names (a bounded report)."""
    ck = tmp_path / "verl" / "global_step_20"
    (ck / "actor").mkdir(parents=True)
    for r in (0, 1):
        for kind in ("model", "optim", "extra_state"):
            torch.save({"rank": r}, ck / "actor" / f"{kind}_world_size_104_rank_{r}.pt")
    (ck / "actor" / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 104}))
    hits = [h for h in assert_fires(api.verify(str(ck)), "CKD122", severity="error") if h.details.get("kind") == "model"]
    assert hits[0].details["missing_ranks"] == list(range(2, 104))
    assert hits[0].details["missing_files"] == [f"actor/model_world_size_104_rank_{r}.pt" for r in range(2, 102)]


def test_verl_a_critic_rank_file_missing_is_named_even_when_the_actor_directory_is_gone(tmp_path):
    """Each component's rank set is judged on its own: a checkpoint without actor/ (a rotation that died
    between its two deletes) still has its critic's missing rank named."""
    ck = tmp_path / "verl" / "global_step_20"
    verl_step(ck, 20)
    shutil.rmtree(ck / "actor")
    os.remove(ck / "critic" / "model_world_size_2_rank_1.pt")
    rep = api.verify(str(ck))
    [hit] = assert_fires(rep, "CKD122", path_contains="global_step_20/critic", severity="error")
    assert hit.details["missing_files"] == ["critic/model_world_size_2_rank_1.pt"] and rep.failed()


# ---- NeMo-RL -------------------------------------------------------------------------------------------
def test_nemo_rl_run_and_staging(tmp_path):
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fixtures"))
    import nemo_rl_ckpt
    root = tmp_path / "ckpts"
    for s in (6, 7):
        nemo_rl_ckpt.write_step(root, step=s, cursor=s - 1, batches=s, targets=(s,) * 4)
    nemo_rl_ckpt.write_step(root, step=8, cursor=7, batches=8, targets=(8,) * 4, name="tmp_step_8")
    rep = api.verify(str(root))
    assert rep.facts["layout"] == "nemo-rl-run" and rep.facts["resume_from"] == "step_7"
    assert_fires(rep, "CKD124", path_contains="tmp_step_8", severity="warning")
    (root / "latest_checkpoint_status.json").write_text(json.dumps({"last_checkpoint_step": 8}))
    rep = api.verify(str(root))
    hits = assert_fires(rep, "CKD113", severity="warning")
    assert "step_8" in hits[0].message and rep.facts["resume_from"] == "step_7"
    assert hits[0].details == {"tracker": "latest_checkpoint_status.json", "target": "step_8", "monitoring": True}
    os.remove(root / "step_7" / "train_dataloader.pt")
    rep = api.verify(str(root))
    assert_fires(rep, "CKD123", path_contains="step_7/train_dataloader.pt")


# ---- Orbax ----------------------------------------------------------------------------------------------
def orbax_step(d, committed=True):
    (d / "state").mkdir(parents=True)
    (d / "state" / "_METADATA").write_text("{}")
    (d / "_CHECKPOINT_METADATA").write_text(json.dumps({"item_handlers": {}, "commit_timestamp_nsecs": 1}))
    if committed:
        (d / "commit_success.txt").write_text(f"Checkpoint commit was successful to {d}")


@pytest.mark.parametrize("status, severity, says", [
    (8, "error", "the tracker names step_8, which exists only as this staging directory"),
    (7, "warning", "a save that is still staging or died; resume target step_7"),
    (5, "warning", "a save that is still staging or died; resume target step_7"),   # names another missing step
])
def test_a_staging_directory_the_tracker_names_is_an_error_any_other_a_warning(tmp_path, status, severity, says):
    """NeMo-RL's latest_checkpoint_status.json pointing at step 8 while only tmp_step_8 exists: the
    save the run believes it made never committed (an error); pointing at step 7 the leftover is
    only a warning."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fixtures"))
    import nemo_rl_ckpt
    root = tmp_path / "ckpts"
    nemo_rl_ckpt.write_step(root, step=7, cursor=6, batches=7, targets=(7,) * 4)
    nemo_rl_ckpt.write_step(root, step=8, cursor=7, batches=8, targets=(8,) * 4, name="tmp_step_8")
    (root / "latest_checkpoint_status.json").write_text(json.dumps({"last_checkpoint_step": status}))
    (hit,) = assert_fires(api.verify(str(root)), "CKD124", path_contains="tmp_step_8", severity=severity)
    assert hit.message.startswith(f"staging leftover tmp_step_8: {says}"), hit.message


def test_orbax_root(tmp_path):
    root = tmp_path / "orbax"
    for s in (20, 30):
        orbax_step(root / str(s))
    rep = api.verify(str(root))
    assert rep.facts["layout"] == "orbax-run" and rep.facts["resume_from"] == "30"
    assert_no_errors(rep)
    orbax_step(root / "40.orbax-checkpoint-tmp", committed=False)
    (root / "50").mkdir()  # Orbax itself would pick this empty step as latest
    rep = api.verify(str(root))
    assert_fires(rep, "CKD124", path_contains="40.orbax-checkpoint-tmp")
    assert_fires(rep, "CKD101", path_contains="/50")
    assert rep.facts["newest_complete"] == "30"


# ---- object stores: more than 1,000 objects ----------------------------------------------------------
def test_s3_listing_over_1000_objects(tmp_path, s3):
    from ckptdoctor.layouts import dcp_writer as W
    env, fs, bucket = s3
    n = 1040
    d = tmp_path / "big"
    W.write(str(d), [W.Item("w", (n, 1), (r, 0), (1, 1), [1.0], rank=r) for r in range(n)])
    fs.pipe({f"{bucket}/ckpt/{f}": (d / f).read_bytes() for f in os.listdir(d)})
    rep = api.verify(f"s3://{bucket}/ckpt")
    assert rep.facts["layout"] == "dcp"
    assert_no_errors(rep)
    fs.rm(f"{bucket}/ckpt/__1037_0.distcp")
    fs.invalidate_cache()
    assert_fires(api.verify(f"s3://{bucket}/ckpt"), "CKD103", path_contains="__1037_0.distcp")


@needs_torch
def test_families_need_no_torch_to_verify(tmp_path):
    import subprocess
    import sys
    run = tmp_path / "verl"
    verl_step(run / "global_step_20", 20)
    (run / "latest_checkpointed_iteration.txt").write_text("20")
    os.remove(run / "global_step_20" / "actor" / "optim_world_size_2_rank_1.pt")  # something to find
    code = ("import sys; sys.modules['torch'] = None\n"
            "from ckptdoctor.cli import main; main(['verify', '-f', 'json', sys.argv[1]])")
    p = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True)
    assert p.returncode == 1, p.stdout + p.stderr
    without = json.loads(p.stdout)
    with_torch = api.verify(str(run)).to_json()
    assert without["findings"] == with_torch["findings"] and without["facts"]["checkpoints"] == \
        [dict(r, age_seconds=without["facts"]["checkpoints"][i]["age_seconds"])
         for i, r in enumerate(with_torch["facts"]["checkpoints"])]
    assert_fires(api.verify(str(run)), "CKD122", path_contains="actor")


def test_trainer_deeper_checks(tmp_path):
    """Issue 15: a checkpoint without optimizer.pt (siblings have it), a truncated trainer_state.json,
    a global_step that is not the directory's N, and a missing per-process RNG file are all named."""
    run = tmp_path / "out"
    for s in (500, 1000, 1500, 2000):
        trainer_ckpt(run / f"checkpoint-{s}", s)
    for s in (500, 1000, 1500, 2000):  # a 2-process run: one RNG file per process
        os.remove(run / f"checkpoint-{s}" / "rng_state.pth")
        for r in range(2):
            torch.save({"python": r}, run / f"checkpoint-{s}" / f"rng_state_{r}.pth")
    assert_no_errors(api.verify(str(run)))
    os.remove(run / "checkpoint-2000" / "optimizer.pt")
    rep = api.verify(str(run))
    hit = assert_fires(rep, "CKD123", path_contains="checkpoint-2000/optimizer.pt", severity="error")[0]
    assert hit.details["peer"] == "checkpoint-1500"
    raw = (run / "checkpoint-1500" / "trainer_state.json").read_bytes()
    (run / "checkpoint-1500" / "trainer_state.json").write_bytes(raw[: len(raw) // 2])
    assert_fires(api.verify(str(run)), "CKD126", path_contains="checkpoint-1500/trainer_state.json")
    (run / "checkpoint-1000" / "trainer_state.json").write_text(json.dumps({"global_step": 900}))
    hit = assert_fires(api.verify(str(run)), "CKD126", path_contains="checkpoint-1000")[0]
    assert hit.details == {"file": "trainer_state.json", "global_step": 900, "directory_step": 1000}
    # no integer step at all: named as that, not as a step mismatch (Trainer takes a missing one as 0,
    # does arithmetic on a string, and reads `true` as step 1)
    for bad in ({}, {"global_step": "1000"}, {"global_step": True}, {"global_step": 1000.0}):
        (run / "checkpoint-1000" / "trainer_state.json").write_text(json.dumps(bad))
        hit = assert_fires(api.verify(str(run)), "CKD126", path_contains="checkpoint-1000")[0]
        assert hit.message == "trainer_state.json has no integer global_step", (bad, hit.message)
        assert hit.details == {"file": "trainer_state.json", "global_step": bad.get("global_step")}
    os.remove(run / "checkpoint-500" / "rng_state_1.pth")
    hit = assert_fires(api.verify(str(run)), "CKD123", path_contains="checkpoint-500", severity="warning")[0]
    assert hit.details["missing_files"] == ["rng_state_1.pth"]


# ---- unknown is not broken (issue 15) -----------------------------------------------------------------
def test_unknown_directory_gets_generic_checks_and_exits_0(tmp_path):
    d = tmp_path / "exported"
    d.mkdir()
    torch.save({"w": torch.ones(3)}, d / "weights.pt")
    torch.save({"epoch": 3, "state_dict": {"w": torch.ones(2)}}, d / "ema.pth")
    (d / "vocab.bin").write_bytes(b"\x01\x02" * 100)
    rep = api.verify(str(d))
    assert not rep.failed() and [f.rule for f in rep.findings] == ["CKD155"], rep.findings
    hit = assert_fires(rep, "CKD155", severity="info")[0]
    assert hit.details["files"] == ["ema.pth", "vocab.bin", "weights.pt"]
    assert "(1 .bin, 1 .pt, 1 .pth): generic checks only" in hit.message   # what it found, by kind
    raw = (d / "weights.pt").read_bytes()
    (d / "weights.pt").write_bytes(raw[: len(raw) - 40])  # truncated: its zip directory is gone
    assert_fires(api.verify(str(d)), "CKD117", path_contains="weights.pt")


def test_a_single_file_is_verified_as_that_file(tmp_path):
    from safetensors.torch import save_file
    from helpers import cli
    save_file({"w": torch.ones(4, 4)}, str(tmp_path / "model.safetensors"))
    torch.save({"w": torch.ones(3)}, tmp_path / "last.ckpt")
    (tmp_path / "other.pt").write_bytes(b"PK\x03\x04 broken")  # a neighbour: not judged
    for f in ("model.safetensors", "last.ckpt"):
        rc, out, err = cli("verify", "-f", "json", str(tmp_path / f))
        doc = json.loads(out)
        assert rc == 0 and not [x for x in doc["findings"] if x["severity"] != "info"], (f, doc["findings"], err)
    raw = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(raw[:-8])
    rc, out, err = cli("verify", "-f", "json", str(tmp_path / "model.safetensors"))
    assert rc == 1 and {x["rule"] for x in json.loads(out)["findings"]} == {"CKD120"}
    rc, out, err = cli("verify", "-f", "json", str(tmp_path / "other.pt"))
    assert rc == 1 and "other.pt" in json.loads(out)["findings"][0]["path"]


def test_a_pickle_that_runs_code_is_named(tmp_path):
    import pickle
    import zipfile

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))
    d = tmp_path / "exported"
    d.mkdir()
    torch.save({"w": torch.ones(3)}, d / "ok.pt")
    with zipfile.ZipFile(d / "optimizer.pt", "w") as z:  # a torch.save layout whose pickle calls os.system
        z.writestr("archive/data.pkl", pickle.dumps({"state": Evil()}, protocol=2))
        z.writestr("archive/version", "3\n")
    hit = assert_fires(api.verify(str(d)), "CKD127", path_contains="optimizer.pt")[0]
    assert any(g.endswith(".system") for g in hit.details["globals"])
    with zipfile.ZipFile(d / "optimizer.pt", "w") as z:  # protocol 4: STACK_GLOBAL with memoised strings
        z.writestr("archive/data.pkl", pickle.dumps([Evil(), Evil()], protocol=4))
    assert_fires(api.verify(str(d)), "CKD127", path_contains="optimizer.pt")
    assert "CKD127" not in api.verify(str(d / "ok.pt")).rules()


def test_an_archive_whose_data_pkl_is_not_beside_its_first_member_is_named_as_torch_refuses_it(tmp_path):
    """torch.load names the archive after its first member and reads `<that>/data.pkl`: a zip led by
    another directory is refused by torch and by CKD117; the same members led by their own
    directory load, and pass."""
    import io
    import zipfile
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    d = tmp_path / "exported"
    d.mkdir()
    for lead, loads in (("notes/readme", False), (None, True)):
        with zipfile.ZipFile(d / "optimizer.pt", "w") as z:
            if lead:
                z.writestr(lead, "not torch's\n")
            for n in src.namelist():
                z.writestr(n, src.read(n))
        try:
            torch.load(d / "optimizer.pt")
            torch_ok = True
        except RuntimeError:
            torch_ok = False
        assert torch_ok == loads
        rules = api.verify(str(d)).rules()
        assert ("CKD117" in rules) == (not loads), (lead, rules)
    assert not [f for f in api.verify(str(d)).findings if f.severity != "info"]  # the sound one: no false alarm


@pytest.mark.parametrize("how", ["behind a decoy member named extra_data.pkl", "deflated"])
def test_a_pickle_that_runs_code_is_named_wherever_torch_load_finds_it(tmp_path, how):
    """CKD127 judges the data.pkl torch.load unpickles: the one beside the archive's first member,
    whatever member before it ends in `data.pkl`, and deflated as well as stored (torch inflates it
    and runs its calls).  torch.load(weights_only=False) is the oracle: it really makes the call."""
    import pickle
    import zipfile
    marker = tmp_path / "ran"

    class Touch:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))
    d = tmp_path / "exported"
    d.mkdir()
    with zipfile.ZipFile(d / "optimizer.pt", "w") as z:
        if how.startswith("behind"):
            z.writestr("archive/extra_data.pkl", pickle.dumps({"state": 1}, protocol=2))
        z.writestr("archive/data.pkl", pickle.dumps({"state": Touch()}, protocol=2),
                   compress_type=zipfile.ZIP_DEFLATED if how == "deflated" else zipfile.ZIP_STORED)
        z.writestr("archive/version", "3\n")
    hit = assert_fires(api.verify(str(d)), "CKD127", path_contains="optimizer.pt")[0]
    assert hit.severity == "error" and any(g.endswith(".system") for g in hit.details["globals"])
    torch.load(d / "optimizer.pt", weights_only=False)
    assert marker.exists()   # what the finding warned of: loading it ran the call


@pytest.mark.parametrize("how", ["deflated 4,000x", "stored, past the limit"])
def test_a_pickle_too_large_to_scan_is_not_cleared_and_is_not_read_whole(tmp_path, monkeypatch, how):
    """A data.pkl CKD127 will not read whole (a deflated one past 100x: torch.save never compresses
    it; any past MAX_PICKLE_BYTES) is a warning naming it, not a silent pass: a call hidden past
    the limit would run on load.  A deflated, ordinary one is scanned and clean: no finding."""
    import pickle
    import zipfile
    from ckptdoctor.io import ptfile

    class Touch:
        def __reduce__(self):
            return (os.system, ("true",))
    d = tmp_path / "exported"
    d.mkdir()
    body = pickle.dumps([b"\0" * (4 << 20), Touch()], protocol=2)   # the call after 4 MiB of zeros
    if how.startswith("stored"):
        monkeypatch.setattr(ptfile, "MAX_PICKLE_BYTES", 1 << 20)
    with zipfile.ZipFile(d / "optimizer.pt", "w") as z:
        z.writestr("archive/data.pkl", body,
                   compress_type=zipfile.ZIP_DEFLATED if how.startswith("deflated") else zipfile.ZIP_STORED)
        z.writestr("archive/version", "3\n")
    from ckptdoctor.io import fs
    reads, real = [], fs.LocalStorage.read_range
    monkeypatch.setattr(fs.LocalStorage, "read_range",
                        lambda self, rel, start, n: reads.append((rel, n)) or real(self, rel, start, n))
    hit = assert_fires(api.verify(str(d)), "CKD127", path_contains="optimizer.pt", severity="warning")[0]
    assert "not scanned" in hit.message and hit.details["limit_bytes"] == 1 << 20
    assert "its pickle (archive/data.pkl) is larger than 1 MiB" in hit.message, hit.message
    assert reads and max(n for _rel, n in reads) <= 1 << 20, reads   # no read past the bound it announced
    with zipfile.ZipFile(d / "optimizer.pt", "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"step": 3}, protocol=2), compress_type=zipfile.ZIP_DEFLATED)
        z.writestr("archive/version", "3\n")
    assert "CKD127" not in api.verify(str(d)).rules()


def test_every_code_global_of_a_protocol_4_pickle_is_named_even_when_its_module_comes_from_the_memo(tmp_path):
    """Protocol 4 writes a module name once and fetches it from the memo for the next global of
    that module (MEMOIZE ... BINGET): CKD127 names both calls, not only the first."""
    import pickle
    import zipfile

    class System:
        def __reduce__(self):
            return (os.system, ("true",))

    class Kill:
        def __reduce__(self):
            return (os.kill, (0, 0))
    data = pickle.dumps([System(), Kill()], protocol=4)
    assert data.count(os.system.__module__.encode()) == 1  # the second global's module is a memo fetch
    d = tmp_path / "exported"
    d.mkdir()
    with zipfile.ZipFile(d / "optimizer.pt", "w") as z:
        z.writestr("archive/data.pkl", data)
        z.writestr("archive/version", "3\n")
    hit = assert_fires(api.verify(str(d)), "CKD127", path_contains="optimizer.pt")[0]
    assert sorted(hit.details["globals"]) == [f"{os.system.__module__}.kill", f"{os.system.__module__}.system"]


def test_a_deflated_pickle_under_100x_past_1_mib_is_scanned(tmp_path):
    """A deflated data.pkl of ~20 KiB that inflates to 1.5 MiB (75x: under the 100x bound, past the
    1 MiB floor) is inflated and scanned: the call after its data is named (an error)."""
    import pickle
    import random
    import zipfile

    class Touch:
        def __reduce__(self):
            return (os.system, ("true",))
    noise = random.Random(7).randbytes(20 << 10)             # incompressible: sets the compressed size
    body = pickle.dumps([noise, b"\0" * (3 << 19), Touch()], protocol=2)
    d = tmp_path / "exported"
    d.mkdir()
    with zipfile.ZipFile(d / "optimizer.pt", "w") as z:
        z.writestr("archive/data.pkl", body, compress_type=zipfile.ZIP_DEFLATED)
        z.writestr("archive/version", "3\n")
        packed = z.getinfo("archive/data.pkl").compress_size
    assert 1 << 20 < len(body) < 100 * packed and 100 * packed > 1 << 20, (len(body), packed)
    (hit,) = assert_fires(api.verify(str(d)), "CKD127", path_contains="optimizer.pt", severity="error")
    assert hit.details["globals"] == [f"{os.system.__module__}.system"], hit.details


def test_an_archive_whose_pickle_cannot_be_scanned_does_not_stop_the_next_archives_scan(tmp_path):
    """Two archives: the first's data.pkl is LZMA-compressed (a method CKD127 does not inflate), the
    second's calls code -- the second is still scanned and named."""
    import zipfile
    mod = os.system.__module__.encode()
    d = _exported_optimizer(tmp_path, b"\x80\x02c" + mod + b"\nsystem\nX\x04\x00\x00\x00true\x85R.")
    with zipfile.ZipFile(d / "a_model.pt", "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.", compress_type=zipfile.ZIP_LZMA)
        z.writestr("archive/version", "3\n")
    (hit,) = assert_fires(api.verify(str(d)), "CKD127", path_contains="optimizer.pt", severity="error")
    assert hit.details["globals"] == [f"{mod.decode()}.system"], hit.details


def test_a_pickle_calling_builtins_eval_is_named(tmp_path):
    """builtins.eval (and the other builtins that run or reach code) are named like os.system."""
    data = b"\x80\x02cbuiltins\neval\nX\x01\x00\x00\x001\x85R."   # never loaded here
    d = _exported_optimizer(tmp_path, data)
    (hit,) = assert_fires(api.verify(str(d)), "CKD127", path_contains="optimizer.pt", severity="error")
    assert hit.details["globals"] == ["builtins.eval"], hit.details


def test_an_archive_that_cannot_be_read_does_not_stop_the_next_archives_scan(tmp_path, monkeypatch):
    """The first archive's pickle cannot be read (an I/O error after its directory was read): the
    second archive is still scanned and its code call named."""
    import zipfile
    from ckptdoctor.io import fs
    mod = os.system.__module__.encode()
    d = _exported_optimizer(tmp_path, b"\x80\x02c" + mod + b"\nsystem\nX\x04\x00\x00\x00true\x85R.")
    with zipfile.ZipFile(d / "a_model.pt", "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/version", "3\n")
    real = fs.LocalStorage.read_range

    def read_range(self, rel, start, n):
        if rel.endswith("a_model.pt") and n == 6:     # its directory reads; its 6-byte pickle does not
            raise OSError(5, "Input/output error")
        return real(self, rel, start, n)
    monkeypatch.setattr(fs.LocalStorage, "read_range", read_range)
    hits = assert_fires(api.verify(str(d)), "CKD127", path_contains="optimizer.pt", severity="error")
    assert hits[0].details["globals"] == [f"{mod.decode()}.system"], hits[0].details


def test_a_link_that_cannot_be_followed_for_another_reason_is_not_called_a_loop(tmp_path, monkeypatch):
    """CKD125 calls a link "a symlink loop" only for ELOOP; one whose target cannot be reached for
    another reason (here ESTALE, an NFS server's stale handle) is "a dangling symlink"."""
    import errno
    d = tmp_path / "exported"
    d.mkdir()
    from safetensors.torch import save_file
    save_file(sd(1), str(d / "model.safetensors"))
    (d / "tokenizer.json").write_text("{}")
    os.symlink("tokenizer.json", d / "vocab.json")
    real = os.stat

    def stat(p, *a, **k):
        if str(p).endswith("vocab.json") and k.get("follow_symlinks", True):
            raise OSError(errno.ESTALE, "Stale file handle")
        return real(p, *a, **k)
    monkeypatch.setattr(os, "stat", stat)
    hits = assert_fires(api.verify(str(d)), "CKD125", path_contains="vocab.json", severity="error")
    assert "vocab.json is a dangling symlink" in hits[0].message, hits[0].message


@pytest.mark.parametrize("kind", ["dangling", "loop"])
def test_a_link_to_nothing_is_dangling_and_a_link_to_itself_a_loop(tmp_path, kind):
    """CKD125 says which of the two a checkpoint's unreadable link is: one whose target is gone
    (ENOENT) is "a dangling symlink", one that leads back to itself (ELOOP) "a symlink loop"."""
    d = tmp_path / "exported"
    d.mkdir()
    from safetensors.torch import save_file
    save_file(sd(1), str(d / "model.safetensors"))
    if kind == "dangling":
        os.symlink("tokenizer.json", d / "vocab.json")          # tokenizer.json was never copied
    else:
        os.symlink("merges.txt", d / "vocab.json")
        os.symlink("vocab.json", d / "merges.txt")
    hits = assert_fires(api.verify(str(d)), "CKD125", path_contains="vocab.json", severity="error")
    want = "a dangling symlink" if kind == "dangling" else "a symlink loop"
    assert [h.message for h in hits if "vocab.json" in h.path] == [f"vocab.json is {want}: the file cannot be read"], \
        [h.message for h in hits]


def test_a_symlink_leaving_the_checkpoint_is_a_warning(tmp_path):
    """A file of the checkpoint that is a link to something outside it: CKD125 warns (a copy or a
    publish does not carry it); a link inside the checkpoint is no finding."""
    d = tmp_path / "exported"
    d.mkdir()
    (tmp_path / "outside.json").write_text("{}")
    os.symlink(tmp_path / "outside.json", d / "config.json")
    (d / "tokenizer.json").write_text("{}")
    os.symlink("tokenizer.json", d / "vocab.json")
    from safetensors.torch import save_file
    save_file(sd(1), str(d / "model.safetensors"))
    hits = assert_fires(api.verify(str(d)), "CKD125", severity="warning")
    assert [h.details["file"] for h in hits] == ["config.json"], [h.message for h in hits]


def test_a_code_call_whose_module_name_comes_through_text_memo_opcodes_is_named(tmp_path):
    """A pickle may mix opcodes of any protocol: a module name stored with protocol 0's PUT and
    fetched back with GET for a STACK_GLOBAL still names the call (torch.load(weights_only=False)
    would run it), and so does a global from a dotted submodule of a code module."""
    mod = os.system.__module__.encode()
    uni = lambda b: b"\x8c" + bytes([len(b)]) + b                       # SHORT_BINUNICODE
    call = lambda: b"X\x04\x00\x00\x00true\x85R"                    # 'true', TUPLE1, REDUCE
    data = (b"\x80\x04(" + uni(b"pad") + uni(mod) + b"p5\n" + uni(b"system") + b"\x93" + call()
            + b"g5\n" + uni(b"kill") + b"\x93" + call()
            + b"g5\np7\n0" + b"g7\n" + uni(b"execv") + b"\x93" + call()   # fetched, stored again, fetched
            + uni(b"ctypes.util") + uni(b"find_library") + b"\x93" + call() + b"l.")
    import pickletools
    assert sum(op.name == "STACK_GLOBAL" for op, _a, _p in pickletools.genops(data)) == 4   # never loaded here
    d = _exported_optimizer(tmp_path, data)
    (hit,) = assert_fires(api.verify(str(d)), "CKD127", path_contains="optimizer.pt", severity="error")
    m = mod.decode()
    assert hit.details["globals"] == [f"{m}.system", f"{m}.kill", f"{m}.execv", "ctypes.util.find_library"], \
        hit.details


def _exported_optimizer(tmp_path, data: bytes):
    """A directory holding optimizer.pt: a torch.save-style zip (stored members) whose data.pkl is
    `data` -- hand-assembled opcodes, never loaded here."""
    import zipfile
    d = tmp_path / "exported"
    d.mkdir()
    with zipfile.ZipFile(d / "optimizer.pt", "w") as z:
        z.writestr("archive/data.pkl", data)
        z.writestr("archive/version", "3\n")
    return d


def test_a_pickle_full_of_code_calls_names_its_first_twenty(tmp_path):
    """CKD127 on a pickle that calls code 30 times: the finding's details list the first 20 calls
    (a bounded scan: the verdict does not need the rest)."""
    import pickletools
    mod = os.system.__module__.encode()
    call = b"c" + mod + b"\nsystem\nX\x04\x00\x00\x00true\x85R"   # GLOBAL, 'true', TUPLE1, REDUCE
    data = b"\x80\x02(" + call * 30 + b"l."                          # a list of 30 calls; never loaded here
    assert sum(op.name == "GLOBAL" for op, _a, _p in pickletools.genops(data)) == 30
    d = _exported_optimizer(tmp_path, data)
    (hit,) = assert_fires(api.verify(str(d)), "CKD127", path_contains="optimizer.pt", severity="error")
    assert hit.details["globals"] == [f"{os.system.__module__}.system"] * 20, hit.details["globals"]


@pytest.mark.parametrize("room, scanned", [(0, True), (-1, False)])
def test_a_pickle_exactly_at_the_scan_bound_is_scanned_and_one_byte_over_is_announced(tmp_path, monkeypatch,
                                                                                      room, scanned):
    """CKD127 reads a stored data.pkl of up to MAX_PICKLE_BYTES (inclusive) for calls that run code;
    one past the bound is not read, and says so (a warning), never a silent pass. The bound is
    lowered to the pickle's own size here."""
    from ckptdoctor.io import ptfile
    mod = os.system.__module__.encode()
    data = b"\x80\x02c" + mod + b"\nsystem\nX\x04\x00\x00\x00true\x85R."   # never loaded here
    d = _exported_optimizer(tmp_path, data)
    monkeypatch.setattr(ptfile, "MAX_PICKLE_BYTES", len(data) + room)
    (hit,) = assert_fires(api.verify(str(d)), "CKD127", path_contains="optimizer.pt",
                          severity="error" if scanned else "warning")
    if scanned:
        assert hit.details["globals"] == [f"{os.system.__module__}.system"], hit.details
    else:
        assert "was not scanned" in hit.message, hit.message


def test_a_pickle_calling_many_kinds_of_code_names_five_in_its_message(tmp_path):
    """CKD127's message names five distinct calls (sorted), the details every call found."""
    names = [b"system", b"kill", b"execv", b"popen", b"remove", b"rmdir"]
    mod = os.system.__module__.encode()
    data = b"\x80\x02(" + b"".join(b"c" + mod + b"\n" + n + b"\nX\x01\x00\x00\x00x\x85R" for n in names) + b"l."
    d = _exported_optimizer(tmp_path, data)
    (hit,) = assert_fires(api.verify(str(d)), "CKD127", path_contains="optimizer.pt", severity="error")
    calls = sorted(f"{mod.decode()}.{n.decode()}" for n in names)
    assert f"its pickle calls {', '.join(calls[:5])}: loading it" in hit.message, hit.message
    assert sorted(hit.details["globals"]) == calls


def test_a_trainer_state_json_of_exactly_256_mib_is_read_and_judged_by_its_content(tmp_path):
    """The trainer_state.json bound is 256 MiB, inclusive: a file of exactly that size (a real one
    padded with NUL bytes) is read and named as invalid JSON by what its content is (the NULs after
    the document), not refused by its size."""
    run = tmp_path / "out"
    trainer_ckpt(run / "checkpoint-500", 500)
    os.truncate(run / "checkpoint-500" / "trainer_state.json", 256 << 20)
    (hit,) = assert_fires(api.verify(str(run)), "CKD126", path_contains="trainer_state.json", severity="error")
    assert hit.message.startswith("trainer_state.json is not valid JSON (Extra data: line 1 column"), hit.message
