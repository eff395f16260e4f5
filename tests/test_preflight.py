"""preflight on node-local layouts built from real checkpoints (a 4-rank gloo DCP save), and the
hostlist expander.  The real-Slurm tests are in test_slurm.py."""
import json
import os
import shutil
from pathlib import Path

import pytest

from ckptdoctor.slurm.hostlist import HostlistError, compress, expand, tasks_per_node
from helpers import assert_fires_json, cli, spread

TRACKER = "latest_checkpointed_iteration.txt"


# ---- hostlist ---------------------------------------------------------------------------------
@pytest.mark.parametrize("expr, hosts", [
    ("gpu[001-004,010]", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu010"]),
    ("rack[1-2]-gpu[01-02],login1", ["rack1-gpu01", "rack1-gpu02", "rack2-gpu01", "rack2-gpu02", "login1"]),
    ("n[1-10]", [f"n{i}" for i in range(1, 11)]),
    ("n[001-4]", ["n001", "n002", "n003", "n004"]),
    ("x[1-3,5]y[2-3]", ["x1y2", "x1y3", "x2y2", "x2y3", "x3y2", "x3y3", "x5y2", "x5y3"]),
    ("a1,b1,a2", ["a1", "b1", "a2"]),
    ("node7", ["node7"]),
])
def test_expand(expr, hosts):
    assert expand(expr) == hosts


@pytest.mark.parametrize("expr", ["gpu[1-2", "gpu1-2]", "gpu[3-1]", "gpu[a-b]", "gpu[[1-2]]", "", "a,,b",
                                  "a[1-2]b", "n[1-999999]", "n[1-1000]x[1-1000]"])
def test_expand_rejects_malformed(expr):
    with pytest.raises(HostlistError):
        expand(expr)


@pytest.mark.parametrize("hosts, expr", [
    (["gpu001", "gpu002", "gpu003", "gpu004", "gpu010"], "gpu[001-004,010]"),
    (["a1", "b1", "a2"], "a1,b1,a2"),
    (["n1", "n2", "n3", "n10", "n11"], "n[1-3,10-11]"),
    (["n3", "n1", "n2"], "n[3,1-2]"),
    (["n9", "n10"], "n[9-10]"),
    (["x", "y1"], "x,y1"),
])
def test_compress_like_scontrol(hosts, expr):
    assert compress(hosts) == expr
    assert expand(expr) == hosts


def test_tasks_per_node():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("4", nodes=3) == [4, 4, 4]
    with pytest.raises(HostlistError):
        tasks_per_node("2(x")


# ---- node-local fixtures ------------------------------------------------------------------------
def pre(*args, env=None):
    rc, out, err = cli("preflight", "--format", "json", *map(str, args), env=env)
    assert "Traceback" not in err, err
    return rc, (json.loads(out) if out.strip().startswith("{") else None), err


@pytest.fixture
def four(tmp_path):
    """A 4-rank DCP checkpoint whose items are all row shards (torch's on-disk format, written by
    ckptdoctor's torch-free writer): spread 2 ranks per node on n1, n2, every rank's reads are on
    its node.  (A save with replicated items is not loadable spread this way: test_readsets.py
    proves that against the real dcp.load.)"""
    from ckptdoctor.layouts import dcp_writer as W
    src = tmp_path / "src"
    W.write(str(src), [W.Item("w", (8, 3), (2 * r, 0), (2, 3), [float(r)] * 6, rank=r) for r in range(4)])
    return src, tmp_path / "nodes"


def test_all_shards_present_is_clean(four):
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    spread(src, root, ["n1", "n2"], 2, name="iter_0000200", tracker="200")
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "2")
    assert rc == 0, rep["findings"]
    assert rep["facts"]["resume_from"] == "iter_0000200" == rep["facts"]["newest_reachable"]
    assert [r["node"] for r in rep["facts"]["nodes"]] == ["n1", "n2"]


def test_swapped_node_strands_shards_and_names_fallback(four):
    src, root = four
    spread(src, root, ["n1", "n2"], 2)
    loc = spread(src, root, ["n1", "n2"], 2, name="iter_0000200", tracker="200")
    shutil.copytree(root / "n2", root / "n3")  # n3 joins ...
    shutil.rmtree(root / "n3" / "run7" / "iter_0000200")  # ... with only the older checkpoint
    os.makedirs(root / "n3" / "run7" / "iter_0000200")
    for f in (".metadata",):
        shutil.copy2(src / f, root / "n3" / "run7" / "iter_0000200")
    rc, rep, err = pre(loc, "--nodelist", "n[1,3]", "--ranks-per-node", "2")
    assert rc == 1
    hits = assert_fires_json(rep, "CKD401", path_contains="n3/run7/iter_0000200")
    assert hits[0]["details"]["ranks"] == [2, 3] and hits[0]["severity"] == "error"
    fall = assert_fires_json(rep, "CKD406")
    assert fall[0]["details"] == {"resume_from": "iter_0000200", "newest_reachable": "iter_0000100"}


def test_a_node_missing_several_shards_is_reported_at_the_first_file_it_lists(four):
    """One finding per node: its path is the first of the files it lists, the one its message gives
    as the example, so a reader (or a script taking `path`) opens a file that is really missing."""
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    for r in (2, 3):
        (root / "n2" / "run7" / "iter_0000100" / f"__{r}_0.distcp").unlink()
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "2")
    (hit,) = assert_fires_json(rep, "CKD401", severity="error")
    files = hit["details"]["files"]
    assert rc == 1 and files == ["__2_0.distcp", "__3_0.distcp"], hit
    assert hit["path"].endswith("n2/run7/iter_0000100/" + files[0]) and f"(e.g. {files[0]})" in hit["message"], hit


def test_a_metadata_past_the_size_bound_is_refused_by_preflight_as_by_verify(four):
    """Every read is bounded, and preflight bounds `.metadata` exactly as verify does: a (sparse)
    file one byte past the bound is an error naming the file and the limit, read by neither."""
    from ckptdoctor.layouts.model import MAX_METADATA_BYTES
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    for node in ("n1", "n2"):
        with open(root / node / "run7" / "iter_0000100" / ".metadata", "r+b") as fh:
            fh.truncate(MAX_METADATA_BYTES + 1)
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "2")
    hits = assert_fires_json(rep, "CKD403", path_contains="run7/iter_0000100/.metadata", severity="error")
    assert rc == 1 and {h["details"]["node"] for h in hits} == {"n1", "n2"}, hits
    assert all(f"{MAX_METADATA_BYTES}-byte limit" in h["message"] for h in hits), hits
    rc, out, err = cli("verify", str(root / "n2" / "run7" / "iter_0000100"), "-f", "json")
    assert rc == 1 and f"{MAX_METADATA_BYTES}-byte limit" in out and "Traceback" not in err, (out, err)


def test_ranks_moved_to_another_node_hint(four):
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "1,3")
    hits = assert_fires_json(rep, "CKD401", path_contains="n2/")
    assert "__1_0.distcp is on n1" in hits[0]["hint"]  # rank 1's shard is on n1, but rank 1 now runs on n2


def test_global_file_and_tracker_missing_on_one_node(four):
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2, skip={("n2", ".metadata")})
    os.remove(root / "n2" / "run7" / TRACKER)
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "2")
    hits = assert_fires_json(rep, "CKD403", path_contains="n2/run7")
    msgs = " ".join(h["message"] for h in hits)
    assert ".metadata" in msgs and TRACKER in msgs and "step 0" in msgs


def test_tracker_disagrees_between_nodes(four):
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    spread(src, root, ["n1", "n2"], 2, name="iter_0000200", tracker="200")
    (root / "n2" / "run7" / TRACKER).write_text("100")
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "2")
    hits = assert_fires_json(rep, "CKD404")
    assert hits[0]["details"]["trackers"] == {"n1": "200", "n2": "100"}


def test_short_node_local_copy(four):
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    shard = next((root / "n2" / "run7" / "iter_0000100").glob("__3_*.distcp"))
    os.truncate(shard, shard.stat().st_size // 2)
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "2")
    hits = assert_fires_json(rep, "CKD402", path_contains="n2/run7/iter_0000100/__3_")
    assert hits[0]["details"]["actual_bytes"] < hits[0]["details"]["expected_bytes"]


def test_node_set_changed_against_manifest_and_missing_node(four):
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    env = {"SLURM_JOB_NODELIST": "n[1-2]"}
    for n in ("n1", "n2"):  # the writing job recorded its nodes in the manifest (of each node's partial
        # copy, which alone fails structural verify: hence --force)
        rc, out, err = cli("manifest", "--force", str(root / n / "run7" / "iter_0000100"), env=env)
        assert rc == 0, err
    rc, rep, err = pre(loc, "--nodelist", "n[1,4]", "--ranks-per-node", "2")
    hits = assert_fires_json(rep, "CKD405")
    assert hits[0]["details"]["left"] == ["n2"] and hits[0]["details"]["joined"] == ["n4"]
    assert_fires_json(rep, "CKD407", path_contains="n4/run7")


def test_world_size_changed(four):
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "1")
    hits = assert_fires_json(rep, "CKD408")
    assert hits[0]["details"]["extra_ranks"] == [2, 3]


def test_after_a_world_size_change_a_node_missing_a_file_its_new_rank_overlaps_is_not_cleared(four):
    """8 rows saved by 4 ranks (2 each), resumed by 3 (ceil(8/3) = 3 rows each): new rank 2 reads
    rows 6-7, which only old rank 3's file holds.  Its node holds old ranks 1-2's files, enough
    for a floor-rounded split (which would give rank 2 no rows of that file); it must be an error."""
    src, root = four
    holds = {"n1": (0, 1), "n2": (1, 2), "n3": (1, 2)}
    for node, ranks in holds.items():
        d = root / node / "run7" / "iter_0000100"
        d.mkdir(parents=True)
        for f in os.listdir(src):
            if not f.endswith(".distcp") or int(f[2:].split("_")[0]) in ranks:
                shutil.copy2(src / f, d / f)
        (root / node / "run7" / "latest_checkpointed_iteration.txt").write_text("100")
    rc, rep, err = pre(root / "{node}" / "run7", "--nodelist", "n[1-3]", "--ranks-per-node", "1")
    hits = assert_fires_json(rep, "CKD401")
    assert rc == 1 and [h for h in hits if "n3" in h["message"] and "__3_" in h["message"]], hits
    assert not [h for h in hits if "n1" in h["message"] or "n2" in h["message"]], hits


def test_shared_storage_and_rank_map(fixture_root, tmp_path):
    run = tmp_path / "run7"
    shutil.copytree(fixture_root / "megatron_run", run)
    rc, rep, err = pre(run, "--nodelist", "gpu[01-02]", "--ranks-per-node", "1")
    assert rc == 0 and rep["facts"]["newest_reachable"] == "iter_0000200", rep["findings"]
    m = tmp_path / "map.txt"
    m.write_text("0 gpu02\n1 gpu01\n")
    rc, rep, err = pre(run, "--nodelist", "gpu[01-02]", "--rank-map", m)
    assert rc == 0 and [r["ranks"] for r in rep["facts"]["nodes"]] == [[1, 1], [0, 0]]
    m.write_text("0 gpu02\n2 gpu01\n")
    rc, rep, err = pre(run, "--nodelist", "gpu[01-02]", "--rank-map", m)
    assert rc == 2 and "0..W-1" in err


def test_local_mode_checks_only_this_node(four):
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    os.remove(next((root / "n2" / "run7" / "iter_0000100").glob("__3_*.distcp")))
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "2"}
    rc, rep, err = pre("--local", root / "n1" / "run7", env=env | {"SLURMD_NODENAME": "n1"})
    assert rc == 0, rep["findings"]
    rc, rep, err = pre("--local", root / "n2" / "run7", env=env | {"SLURMD_NODENAME": "n2"})
    assert rc == 1
    hits = assert_fires_json(rep, "CKD401")
    assert hits[0]["details"]["ranks"] == [3] and "__3_0.distcp" in hits[0]["message"]
    rc, rep, err = pre("--local", root / "n2" / "run7", env=env | {"SLURMD_NODENAME": "n9"})
    assert rc == 2 and "not in the node list" in err
    del loc


def test_verl_node_local_and_nvrx_replicas(tmp_path):
    torch = pytest.importorskip("torch")
    # verl: global_step_N/actor/model_world_size_4_rank_R.pt (torch.save of each rank's state, as
    # verl's FSDP checkpoint manager writes them), data.pt on every node
    for i, n in enumerate(["a1", "a2"]):
        d = tmp_path / n / "run" / "global_step_50"
        (d / "actor").mkdir(parents=True)
        for r in (2 * i, 2 * i + 1):
            torch.save({"w": torch.full((4, 4), float(r))}, d / "actor" / f"model_world_size_4_rank_{r}.pt")
        if n == "a1":
            torch.save({"_num_yielded": 3}, d / "data.pt")
        (tmp_path / n / "run" / TRACKER).write_text("50")
    rc, rep, err = pre(tmp_path / "{node}" / "run", "--nodelist", "a[1-2]", "--ranks-per-node", "2")
    hits = assert_fires_json(rep, "CKD403", path_contains="a2/run/global_step_50/data.pt")
    assert hits[0]["severity"] == "error"
    # nvidia-resiliency-ext: <rank>/iter_*_<owner>_local.pt, owner 1 replicated on node b2 only (names and
    # sizes only: preflight judges coverage from listings, it does not open these files)
    for n, holders in (("b1", {0: [0], 1: [1]}), ("b2", {2: [2, 1], 3: [3]})):
        for holder, owners in holders.items():
            d = tmp_path / n / "local" / str(holder)
            d.mkdir(parents=True)
            for o in owners:
                (d / f"iter_0000300_{o}_local.pt").write_bytes(b"x" * 32)
    rc, rep, err = pre(tmp_path / "{node}" / "local", "--nodelist", "b[1-2]", "--ranks-per-node", "2")
    assert rc == 0 and rep["facts"]["newest_reachable"] == "iter_0000300", rep["findings"]
    shutil.rmtree(tmp_path / "b1")  # b1 replaced by b3 with nothing: owner 0 is gone, owner 1 survives
    (tmp_path / "b3" / "local").mkdir(parents=True)
    rc, rep, err = pre(tmp_path / "{node}" / "local", "--nodelist", "b[2-3]", "--ranks-per-node", "2")
    hits = assert_fires_json(rep, "CKD401")
    assert hits[0]["details"]["owners_missing"] == [0]


@pytest.mark.parametrize("args, words", [
    (["--nodelist", "gpu[1-2", "--ranks-per-node", "2"], "unbalanced"),
    (["--nodelist", "gpu[1-2]"], "ranks per node unknown"),
    ([], "no node list"),
])
def test_usage_errors_are_one_line(tmp_path, args, words):
    rc, out, err = cli("preflight", str(tmp_path), *args, env={"SLURM_JOB_NODELIST": "", "SLURM_NODELIST": "",
                                                                "SLURM_NTASKS_PER_NODE": "", "SLURM_TASKS_PER_NODE": ""})
    assert rc == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_preflight_is_read_only(four):
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}
    rc, rep, err = pre(loc, "--nodelist", "n[1-3]", "--ranks-per-node", "2")
    assert rc == 1 and rep["facts"]["resume_from"] == "iter_0000100"  # it ran and judged (n3 holds nothing)
    assert_fires_json(rep, "CKD407", path_contains="n3")
    assert {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")} == before


def test_megatron_legacy_grid_node_local(fixture_root, tmp_path):
    """TP=2 x PP=2 legacy checkpoint, 8 ranks on 2 nodes (DP=2): rank r reads
    mp_rank_{r % 2:02d}_{r // 4:03d}; each node holds only its pipeline stage's directories."""
    src = fixture_root / "megatron_legacy"
    for i, n in enumerate(("m1", "m2")):
        for it in ("iter_0000010", "iter_0000020"):
            for d in (src / it).iterdir():
                if d.name.endswith(f"_{i:03d}"):
                    shutil.copytree(d, tmp_path / n / "run" / it / d.name)
        shutil.copy2(src / TRACKER, tmp_path / n / "run" / TRACKER)
    loc = tmp_path / "{node}" / "run"
    rc, rep, err = pre(loc, "--nodelist", "m[1-2]", "--ranks-per-node", "4")
    assert rc == 0 and rep["facts"]["newest_reachable"] == "iter_0000020", rep["findings"]
    shutil.rmtree(tmp_path / "m2" / "run" / "iter_0000020" / "mp_rank_01_001")
    rc, rep, err = pre(loc, "--nodelist", "m[1-2]", "--ranks-per-node", "4")
    hits = assert_fires_json(rep, "CKD401", path_contains="m2/run/iter_0000020/mp_rank_01_001")
    assert hits[0]["details"]["ranks"] == [5, 7]
    assert rep["facts"]["newest_reachable"] == "iter_0000010"
    rc, rep, err = pre(loc, "--nodelist", "m[1-2]", "--ranks-per-node", "3")
    assert_fires_json(rep, "CKD408")  # 6 ranks do not fill a TP 2 x PP 2 grid


def test_deepspeed_node_local(tmp_path):
    torch = pytest.importorskip("torch")
    for i, n in enumerate(("d1", "d2")):
        tag = tmp_path / n / "ds" / "global_step3"
        tag.mkdir(parents=True)
        torch.save({"module": {}}, tag / "mp_rank_00_model_states.pt")
        for r in (2 * i, 2 * i + 1):
            torch.save({"optimizer_state_dict": {"partition_count": [4]}},
                       tag / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
        (tmp_path / n / "ds" / "latest").write_text("global_step3")
    loc = tmp_path / "{node}" / "ds"
    rc, rep, err = pre(loc, "--nodelist", "d[1-2]", "--ranks-per-node", "2")
    assert rc == 0 and rep["facts"]["resume_from"] == "global_step3", rep["findings"]
    os.remove(tmp_path / "d2" / "ds" / "global_step3" / "zero_pp_rank_3_mp_rank_00_optim_states.pt")
    os.remove(tmp_path / "d1" / "ds" / "global_step3" / "mp_rank_00_model_states.pt")
    rc, rep, err = pre(loc, "--nodelist", "d[1-2]", "--ranks-per-node", "2")
    assert assert_fires_json(rep, "CKD401")[0]["details"]["ranks"] == [3]
    assert_fires_json(rep, "CKD403", path_contains="d1/ds/global_step3/mp_rank_00_model_states.pt")


# ---- a replacement node with an empty disk (issue 14) --------------------------------------------
def test_local_mode_never_passes_an_empty_or_missing_run_directory(four, tmp_path):
    src, root = four
    spread(src, root, ["n1", "n2"], 2)
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "2", "SLURMD_NODENAME": "n2"}
    shutil.rmtree(root / "n2" / "run7")
    (root / "n2" / "run7").mkdir()                      # the replacement node's empty NVMe
    rc, rep, err = pre("--local", root / "n2" / "run7", env=env)
    hit = assert_fires_json(rep, "CKD409")[0]
    assert rc == 1 and hit["details"]["node"] == "n2" and hit["details"]["ranks"] == [2, 3]
    assert "--allow-fresh" in hit["hint"]
    rc, rep, err = pre("--local", root / "n2" / "run7", "--allow-fresh", env=env)
    assert rc == 0 and rep["findings"] == [], rep["findings"]
    (root / "n2" / "run7").rmdir()                      # not even the directory
    rc, rep, err = pre("--local", root / "n2" / "run7", env=env)
    assert rc == 1 and assert_fires_json(rep, "CKD407")[0]["details"]["ranks"] == [2, 3]
    rc, rep, err = pre("--local", root / "n2" / "run7", "--allow-fresh", env=env)
    assert rc == 0, rep["findings"]


def test_all_nodes_a_node_without_checkpoint_while_others_have_one(four):
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    (root / "n3" / "run7").mkdir(parents=True)
    for extra in ([], ["--allow-fresh"]):  # others would resume: fresh or not, n3 is wrong
        rc, rep, err = pre(loc, "--nodelist", "n[1-3]", "--ranks-per-node", "2", *extra)
        hits = assert_fires_json(rep, "CKD409")
        assert rc == 1 and [h["details"]["node"] for h in hits] == ["n3"]
        assert hits[0]["details"]["nodes_with_checkpoints"] == ["n1", "n2"]


def test_a_fresh_job_on_empty_nodes(tmp_path):
    for n in ("n1", "n2"):
        (tmp_path / n / "run7").mkdir(parents=True)
    loc = f"{tmp_path}/{{node}}/run7"
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "1")
    assert rc == 1 and len(assert_fires_json(rep, "CKD409")) == 2
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "1", "--allow-fresh")
    assert rc == 0 and rep["findings"] == []


def test_expect_step_and_tracker_copy(four, tmp_path):
    src, root = four
    spread(src, root, ["n1", "n2"], 2)
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "2", "SLURMD_NODENAME": "n1"}
    here = root / "n1" / "run7"
    rc, rep, err = pre("--local", here, "--expect-step", "100", env=env)
    assert rc == 0, rep["findings"]
    rc, rep, err = pre("--local", here, "--expect-step", "200", env=env)
    hit = assert_fires_json(rep, "CKD404")[0]
    assert rc == 1 and hit["details"]["expected_step"] == 200 and hit["details"]["resume_step"] == 100
    durable = tmp_path / "latest_checkpointed_iteration.txt"
    durable.write_text("200\n")
    rc, rep, err = pre("--local", here, "--expect-tracker", durable, env=env)
    assert rc == 1 and "--expect-tracker" in assert_fires_json(rep, "CKD404")[0]["message"]
    durable.write_text("100\n")
    rc, rep, err = pre("--local", here, "--expect-tracker", durable, env=env)
    assert rc == 0, rep["findings"]
    rc, rep, err = pre("--local", here, "--expect-tracker", tmp_path / "nope", env=env)
    assert rc == 2 and "nope" in err


# ---- no hangs (issue 14) ---------------------------------------------------------------------------
SITE = '''
import errno, time
import fsspec
from fsspec.implementations.local import LocalFileSystem

class Stall(LocalFileSystem):
    """A mount that never answers."""
    protocol = "stall"
    def info(self, path, **kw):
        time.sleep(3600)
    ls = info

class Flaky(LocalFileSystem):
    """A mount that answers ESTALE once, then works (a server failover)."""
    protocol = "flaky"
    failed = False
    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(str(path).replace("flaky://", "", 1))
    def info(self, path, **kw):
        if not Flaky.failed:
            Flaky.failed = True
            raise OSError(errno.ESTALE, "Stale file handle")
        return super().info(path, **kw)

fsspec.register_implementation("stall", Stall, clobber=True)
fsspec.register_implementation("flaky", Flaky, clobber=True)
'''


@pytest.fixture
def odd_mounts(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    return {"PYTHONPATH": str(site), "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "2",
            "SLURMD_NODENAME": "n1"}


def test_a_location_that_never_answers_is_exit_75_within_the_timeout(odd_mounts):
    import time
    t = time.monotonic()
    rc, out, err = cli("preflight", "--local", "stall:///nvme/run7", "--timeout", "2", env=odd_mounts, timeout=60)
    took = time.monotonic() - t
    assert rc == 75 and "did not answer within 2 s" in err and took < 10, (rc, err, took)
    t = time.monotonic()  # --local has a deadline by default (below Slurm's MessageTimeout)
    rc, out, err = cli("preflight", "--local", "stall:///nvme/run7", env=odd_mounts, timeout=60)
    assert rc == 75 and time.monotonic() - t < 15, err


def test_a_transient_error_is_retried_once(four, odd_mounts):
    src, root = four
    spread(src, root, ["n1", "n2"], 2)
    rc, out, err = cli("preflight", "--local", f"flaky://{root}/n1/run7", "-f", "json", env=odd_mounts)
    assert "retrying once" in err and rc == 0, (rc, out, err)
    assert json.loads(out)["facts"]["resume_from"] == "iter_0000100"


def test_host_memory_budget(four):
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    base = [loc, "--nodelist", "n[1-2]", "--ranks-per-node", "2"]
    rc, rep, err = pre(*base, "--mem-per-node", "1K")
    hits = assert_fires_json(rep, "CKD410")
    assert rc == 1 and {h["details"]["node"] for h in hits} == {"n1", "n2"} and hits[0]["severity"] == "error"
    d = hits[0]["details"]
    records = {}  # the bytes n1's ranks read, from the metadata torch reads
    from ckptdoctor.layouts import dcp as D
    md = D.parse((src / ".metadata").read_bytes())
    for s in md.storage:
        if s.relative_path in ("__0_0.distcp", "__1_0.distcp"):
            records[s.fqn, s.offset] = s.length
    pow2 = sum(1 << (n - 1).bit_length() for n in records.values())
    assert d["load_bytes"] == sum(records.values()) and d["pinned_bytes"] == pow2
    assert d["peak_bytes"] == d["load_bytes"] + d["pinned_bytes"] and d["memory_source"] == "--mem-per-node"
    rc, rep, err = pre(*base, "--mem-per-node", f"{int(d['peak_bytes'] / 0.9)}B")
    assert rc == 0 and assert_fires_json(rep, "CKD410", severity="warning")
    rc, rep, err = pre(*base, "--mem-per-node", f"{d['peak_bytes']}B")     # exactly fits: still a warning
    assert rc == 0 and assert_fires_json(rep, "CKD410", severity="warning")
    rc, rep, err = pre(*base, "--mem-per-node", f"{int(d['peak_bytes'] / 1.1)}B")  # 110 %: over, an error
    assert rc == 1 and assert_fires_json(rep, "CKD410", severity="error")
    rc, rep, err = pre(*base, "--mem-per-node", "1G")
    assert rc == 0 and not [f for f in rep["findings"] if f["rule"] == "CKD410"]
    rc, rep, err = pre(*base, env={"SLURM_MEM_PER_NODE": "1"})  # Slurm's MiB: plenty
    assert rc == 0, rep["findings"]
    rc, rep, err = pre(*base, "--mem-per-node", "lots")
    assert rc == 2 and "lots" in err


def test_memory_model_is_configurable(four, tmp_path):
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    cfg = tmp_path / "ckptdoctor.toml"
    cfg.write_text("[preflight]\nmemory-pinned = false\nmemory-copy-factor = 2.0\n")
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "2", "--mem-per-node", "1K",
                       "--config", cfg)
    d = assert_fires_json(rep, "CKD410")[0]["details"]
    assert d["peak_bytes"] == 2 * d["load_bytes"] and d["pinned_model"] is False and d["copy_factor"] == 2.0


# ---- whole-allocation agreement from every node's view (issue 14) --------------------------------
def _views(root, nodes, tmp_path, *extra):
    out = []
    for n in nodes:
        env = {"SLURM_JOB_NODELIST": f"n[1-{len(nodes)}]", "SLURM_NTASKS_PER_NODE": "2", "SLURMD_NODENAME": n}
        rc, o, err = cli("preflight", "--local", str(root / n / "run7"), "-f", "json", *extra, env=env)
        p = tmp_path / f"{n}.json"
        p.write_text(o)
        out.append(str(p))
    return out


def test_views_agree_and_disagree(four, tmp_path):
    src, root = four
    spread(src, root, ["n1", "n2"], 2)
    spread(src, root, ["n1", "n2"], 2, name="iter_0000200", tracker="200")
    files = _views(root, ["n1", "n2"], tmp_path)
    rc, out, err = cli("preflight", "--views", str(tmp_path), "--nodelist", "n[1-2]", "-f", "json")  # a directory
    doc = json.loads(out)
    assert rc == 0 and doc["findings"] == [] and doc["facts"]["resume_from"] == "iter_0000200", doc
    (root / "n2" / "run7" / TRACKER).write_text("100")  # each node is fine alone ...
    files = _views(root, ["n1", "n2"], tmp_path)
    for f in files:
        assert not [x for x in json.loads(Path(f).read_text())["findings"] if x["severity"] == "error"]
    rc, out, err = cli("preflight", "--views", files[0], "--views", files[1], "--nodelist", "n[1-2]", "-f", "json")
    hit = assert_fires_json(json.loads(out), "CKD404")[0]  # ... together they would split the job
    assert rc == 1 and hit["details"]["resume_from"] == {"n1": "iter_0000200", "n2": "iter_0000100"}


def test_views_a_fresh_node_among_resuming_ones_and_a_silent_node(four, tmp_path):
    src, root = four
    spread(src, root, ["n1", "n2"], 2)
    (root / "n3" / "run7").mkdir(parents=True)
    files = _views(root, ["n1", "n2", "n3"], tmp_path, "--allow-fresh")  # n3 alone passes with --allow-fresh
    assert json.loads(Path(files[2]).read_text())["findings"] == []
    rc, out, err = cli("preflight", "--views", str(tmp_path), "--nodelist", "n[1-3]", "-f", "json")
    hit = assert_fires_json(json.loads(out), "CKD409")[0]
    assert rc == 1 and hit["details"]["node"] == "n3" and hit["details"]["ranks"] == [4, 5]
    Path(files[1]).write_text("")  # n2's preflight died before writing its report
    rc, out, err = cli("preflight", "--views", str(tmp_path), "--nodelist", "n[1-3]", "-f", "json")
    rules = {f["rule"] for f in json.loads(out)["findings"]}
    assert rc == 1 and {"CKD407", "CKD409"} <= rules and "Traceback" not in err
    rc, out, err = cli("preflight", "--views", files[0], "--nodelist", "n[1-3]", "-f", "json")
    missing = [f["details"].get("node") for f in json.loads(out)["findings"] if f["rule"] == "CKD407"]
    assert rc == 1 and missing == ["n2", "n3"]


# ---- issue 36: fail closed on .metadata, say where files are, one finding per fact ---------------
@pytest.mark.parametrize("shared", [False, True], ids=["node-local", "shared"])
def test_a_metadata_that_is_not_a_regular_file_is_an_error_not_a_pass(four, shared):
    """verify refuses a FIFO `.metadata`; preflight reads it the same way (bounded, regular files
    only): an error naming the file, never `will resume from ... ok`, never a hang."""
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    if shared:
        loc = str(root / "shared")
        shutil.copytree(root / "n1" / "run7", loc)
        for f in (root / "n2" / "run7" / "iter_0000100").iterdir():
            shutil.copy2(f, Path(loc) / "iter_0000100" / f.name)
    bad = Path(loc.replace("{node}", "n2")) / "iter_0000100" / ".metadata"
    bad.unlink()
    os.mkfifo(bad)
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "2")
    hits = assert_fires_json(rep, "CKD403", path_contains=".metadata")
    assert rc == 1 and all(h["severity"] == "error" for h in hits), rep["findings"]
    assert {h["details"]["node"] for h in hits} == ({"n1", "n2"} if shared else {"n2"})
    assert "unreadable" in hits[0]["message"] and "regular" in hits[0]["message"], hits[0]["message"]


def test_local_mode_says_the_whole_allocation_and_where_missing_files_might_be(four):
    src, root = four
    spread(src, root, ["n1", "n2"], 2)
    os.remove(root / "n2" / "run7" / "iter_0000100" / "__3_0.distcp")
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "2", "SLURMD_NODENAME": "n2"}
    rc, out, err = cli("preflight", "--local", str(root / "n2" / "run7"), env=env)
    assert rc == 1 and "allocation: 2 nodes, 4 ranks (checked on this node only: n2)" in out, out
    rc, rep, err = pre("--local", root / "n2" / "run7", env=env)
    hint = assert_fires_json(rep, "CKD401")[0]["hint"]
    assert "outside this allocation (or nowhere)" not in hint and "--local sees only this node" in hint


def test_per_node_hint_names_the_node_inside_the_allocation_that_holds_the_file(four):
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    shutil.move(root / "n2" / "run7" / "iter_0000100" / "__3_0.distcp", root / "n1" / "run7" / "iter_0000100")
    os.remove(root / "n2" / "run7" / "iter_0000100" / "__2_0.distcp")
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "2")
    (hit,) = assert_fires_json(rep, "CKD401")
    assert hit["details"]["files_by_rank"] == {"2": ["__2_0.distcp"], "3": ["__3_0.distcp"]}
    assert "__3_0.distcp is on n1" in hit["hint"] and "1 file(s) (e.g. __2_0.distcp) are on no node" in hit["hint"]


@pytest.mark.parametrize("n2", ["absent", "empty", "tracker-only"])
def test_allow_fresh_never_passes_a_mixed_allocation_in_either_mode(four, tmp_path, n2):
    """One node holds the checkpoint, the other nothing: with --allow-fresh, the per-node check and
    the gathered --views judgement both fail it (the others would resume), each once per node."""
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    shutil.rmtree(root / "n2" / "run7")
    if n2 != "absent":
        (root / "n2" / "run7").mkdir()
    if n2 == "tracker-only":
        (root / "n2" / "run7" / TRACKER).write_text("100")
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "2", "--allow-fresh")
    assert rc == 1 and {"CKD407", "CKD409", "CKD406"} & {f["rule"] for f in rep["findings"]}, rep["findings"]
    for extra in (["--allow-fresh"], []):
        (tmp_path / f"v{len(extra)}").mkdir()
        _views(root, ["n1", "n2"], tmp_path / f"v{len(extra)}", *extra)
        rc, out, err = cli("preflight", "--views", str(tmp_path / f"v{len(extra)}"), "--nodelist", "n[1-2]", "-f", "json")
        doc = json.loads(out)
        about_n2 = [f["rule"] for f in doc["findings"] if f["details"].get("node") == "n2" and
                    f["rule"] in ("CKD407", "CKD409")]
        assert rc == 1 and len(about_n2) == 1, (extra, doc["findings"])


def test_after_a_world_size_change_each_rank_is_charged_its_share_of_a_chunk_it_overlaps(tmp_path):
    """The host-memory estimate (CKD410) after resharding: a tensor of 8 rows saved by 2 ranks
    (4 rows each) and loaded by 4 reads 2 rows per new rank, so each is charged half of one saved
    chunk's bytes -- not the whole chunk, and never more than it."""
    from ckptdoctor.layouts import dcp as D
    from ckptdoctor.layouts import dcp_writer as W
    from ckptdoctor.preflight import readsets
    W.write(str(tmp_path), [W.Item("w", (8, 4), (r * 4, 0), (4, 4), [1.0] * 16, rank=r) for r in range(2)])
    md = D.parse((tmp_path / ".metadata").read_bytes())
    listed = {p.name for p in tmp_path.iterdir()}
    rs = readsets.plan(md, 4, listed)
    assert rs.resharded and rs.saved_world == 2
    length = {s.relative_path: s.length for s in md.storage}
    assert {r: sorted(rs.by_rank[r]) for r in range(4)} == {0: ["__0_0.distcp"], 1: ["__0_0.distcp"],
                                                             2: ["__1_0.distcp"], 3: ["__1_0.distcp"]}
    assert rs.bytes_by_rank == {0: length["__0_0.distcp"] // 2, 1: length["__0_0.distcp"] // 2,
                                2: length["__1_0.distcp"] // 2, 3: length["__1_0.distcp"] // 2}


def test_host_memory_blocks_are_the_power_of_two_at_or_above_each_request():
    """The host-memory model charges each pinned buffer as the CUDA caching host allocator does: the
    smallest power of two at or above its size (exactly the size when it is one), nothing for 0."""
    from ckptdoctor.preflight.readsets import pow2
    assert pow2(0) == 0 and [pow2(n) for n in (1, 2, 3, 4, 5, 9, 17)] == [1, 2, 4, 4, 8, 16, 32]
    for n in range(1, 5000):
        p = pow2(n)
        assert p & (p - 1) == 0 and n <= p < 2 * n, (n, p)


@pytest.mark.parametrize("gone, locked, word", [((2, 3), (), "missing"), ((), (2, 3), "unreadable"),
                                                ((3,), (2,), "missing or unreadable")])
def test_a_nodes_shards_are_said_missing_unreadable_or_both_as_they_are(four, gone, locked, word):
    """CKD401's sentence names what is wrong with the node's files: all absent, all there but not
    readable by the user the job runs as (mode 000), or some of each."""
    import subprocess
    import sys
    from helpers import as_unprivileged
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    d = root / "n2" / "run7" / "iter_0000100"
    for r in gone:
        (d / f"__{r}_0.distcp").unlink()
    for r in locked:
        (d / f"__{r}_0.distcp").chmod(0)
    p = subprocess.run(as_unprivileged() + [sys.executable, "-m", "ckptdoctor", "preflight", "-f", "json", loc,
                                            "--nodelist", "n[1-2]", "--ranks-per-node", "2"],
                       capture_output=True, text=True, timeout=120)
    (hit,) = assert_fires_json(json.loads(p.stdout), "CKD401", severity="error")
    assert p.returncode == 1 and f"2 shard file(s) of iter_0000100 {word} for ranks 2,3 (e.g." in hit["message"], \
        hit["message"]
    assert hit["details"]["unreadable"] == [f"__{r}_0.distcp" for r in locked], hit["details"]


@pytest.mark.parametrize("keys", [1, 2, 3])
def test_an_undecided_file_names_its_first_key_and_counts_the_others(tmp_path, keys):
    """CKD411 names one key a node's ranks may need from a file they lack and counts the rest
    exactly: "(+N more keys)" with N the keys not named, nothing for one key.  Here keys named for
    data-parallel rank 1 sit in global rank 2's file, so their names cannot say who reads them."""
    from ckptdoctor.layouts import dcp_writer as W
    src = tmp_path / "src"
    items = [W.Item("w", (8, 3), (2 * r, 0), (2, 3), [float(r)] * 6, rank=r) for r in range(4)]
    for d in (0, 1):
        items += [W.Item(f"loader.dp_rank_{d}.k{k}", (1,), (0,), (1,), [float(k)], rank=2 * d) for k in range(keys)]
    W.write(str(src), items)
    loc = spread(src, tmp_path / "nodes", ["n1", "n2"], 2)
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "2")
    hits = [h for h in assert_fires_json(rep, "CKD411", severity="warning") if h["details"]["file"] == "__2_0.distcp"]
    (hit,) = hits
    assert hit["details"]["keys"] == [f"loader.dp_rank_1.k{k}" for k in range(keys)], hit["details"]
    more = f" (+{keys - 1} more keys)" if keys > 1 else ""
    assert f"may read it for 'loader.dp_rank_1.k0'{more}: " in hit["message"], hit["message"]


def test_inside_a_slurm_job_each_nodes_memory_is_its_realmemory_in_mib(tmp_path, monkeypatch):
    """Without --mem-per-node or $SLURM_MEM_PER_NODE, preflight asks scontrol for each node's
    RealMemory, which Slurm gives in MiB (a fake scontrol answers as Slurm 23's `show node -o`)."""
    from ckptdoctor.preflight import memory
    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'NodeName=n1 Arch=x86_64 CPUTot=2 RealMemory=1024 AllocMem=0 FreeMem=900'\n"
                    "echo 'NodeName=n2 Arch=x86_64 CPUTot=2 RealMemory=3 AllocMem=0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.delenv("SLURM_MEM_PER_NODE", raising=False)
    got = memory.node_memory(["n1", "n2"], None, None)
    assert got == {"n1": memory.NodeMemory(1 << 30, "scontrol RealMemory"),
                   "n2": memory.NodeMemory(3 << 20, "scontrol RealMemory")}


def test_a_per_rank_sharded_object_of_a_512_rank_save_is_decided_by_its_files(tmp_path):
    """A Megatron ShardedObject saved one shard per rank (`rng_state/shard_R_512`, each in rank R's
    file) is read by that rank alone: past 256 ranks too (counts compared by value), so a node
    lacking one such file strands exactly that rank -- an error, not an undecided warning."""
    from ckptdoctor.layouts import dcp_writer as W
    world = 512
    src = tmp_path / "src"
    W.write(str(src), [W.Item(f"rng_state/shard_{r}_{world}", (1,), (0,), (1,), [float(r)], rank=r)
                       for r in range(world)])
    loc = spread(src, tmp_path / "nodes", ["n1", "n2"], world // 2)
    (tmp_path / "nodes" / "n1" / "run7" / "iter_0000100" / "__5_0.distcp").unlink()
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", str(world // 2))
    (hit,) = assert_fires_json(rep, "CKD401", severity="error")
    assert rc == 1 and hit["details"]["ranks"] == [5] and hit["details"]["files"] == ["__5_0.distcp"], hit
    assert not [f for f in rep["findings"] if f["rule"] == "CKD411"], rep["findings"]


@pytest.mark.parametrize("text, size", [("512", 512 << 20), ("4096K", 4 << 20), ("3M", 3 << 20), ("2G", 2 << 30),
                                        ("1.5T", 3 << 39), ("1000000B", 1000000), ("2GiB", 2 << 30), ("1gb", 1 << 30)])
def test_memory_sizes_are_read_as_slurm_writes_them(text, size):
    """A bare number is MiB (Slurm's --mem); K, M, G, T are binary multiples, B is bytes."""
    from ckptdoctor.preflight import memory
    assert memory.parse_size(text, "--mem-per-node") == size


@pytest.mark.parametrize("how", ["option", "env"])
def test_a_memory_size_of_0_is_the_whole_node_as_in_slurm_not_a_budget_switched_off(tmp_path, monkeypatch, how):
    """`#SBATCH --mem=0` (Slurm: all of each node's memory) sets $SLURM_MEM_PER_NODE=0; it and
    `--mem-per-node 0` mean the node's whole memory, looked up (scontrol here), never 0 bytes --
    which CKD410 would read as unknown and skip."""
    from ckptdoctor.preflight import memory
    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'NodeName=n1 RealMemory=2048'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    if how == "env":
        monkeypatch.setenv("SLURM_MEM_PER_NODE", "0")
    else:
        monkeypatch.delenv("SLURM_MEM_PER_NODE", raising=False)
    got = memory.node_memory(["n1"], "0" if how == "option" else None, None)
    assert got == {"n1": memory.NodeMemory(2 << 30, "scontrol RealMemory")}, got


def test_an_empty_node_says_why_it_is_wrong_in_local_mode_and_over_the_allocation(four, tmp_path):
    """CKD409's reason: with --local a node sees only itself (no fresh start declared); over the
    allocation, that no node holds one either."""
    for n in ("n1", "n2"):
        (tmp_path / "fresh" / n / "run7").mkdir(parents=True)
    rc, rep, err = pre(f"{tmp_path}/fresh/{{node}}/run7", "--nodelist", "n[1-2]", "--ranks-per-node", "1")
    for hit in assert_fires_json(rep, "CKD409"):
        assert " holds no checkpoint on any node, and the job does not declare a fresh start: " in hit["message"]
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "1", "SLURMD_NODENAME": "n2"}
    rc, rep, err = pre("--local", tmp_path / "fresh" / "n2" / "run7", env=env)
    (hit,) = assert_fires_json(rep, "CKD409")
    assert " holds no checkpoint and the job does not declare a fresh start: " in hit["message"], hit["message"]


def test_files_on_no_node_are_counted_and_the_first_of_them_named(four):
    src, root = four
    loc = spread(src, root, ["n1", "n2"], 2)
    for r in (2, 3):
        os.remove(root / "n2" / "run7" / "iter_0000100" / f"__{r}_0.distcp")
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "2")
    (hit,) = assert_fires_json(rep, "CKD401")
    assert "2 file(s) (e.g. __2_0.distcp) are on no node of this allocation" in hit["hint"], hit["hint"]


def test_an_unreadable_metadata_under_a_long_path_still_says_why(four):
    """The reason is the part of a CKD403 message a user needs; a deep path (the finding names the
    file already) must not push it past the message's bound: a 200-character directory here."""
    from ckptdoctor.layouts.model import MAX_METADATA_BYTES
    src, root = four
    loc = spread(src, root / ("deep-" * 40), ["n1", "n2"], 2)
    for node in ("n1", "n2"):
        with open(loc.replace("{node}", node) + "/iter_0000100/.metadata", "r+b") as fh:
            fh.truncate(MAX_METADATA_BYTES + 1)
    rc, rep, err = pre(loc, "--nodelist", "n[1-2]", "--ranks-per-node", "2")
    hits = assert_fires_json(rep, "CKD403", path_contains=".metadata", severity="error")
    assert rc == 1 and len(hits) == 2 and all(
        f"({MAX_METADATA_BYTES + 1} bytes, larger than the {MAX_METADATA_BYTES}-byte limit for this file)"
        in h["message"] for h in hits), [h["message"] for h in hits]


@pytest.mark.parametrize("limit, want", [("524288", (524288, "cgroup memory.max")),
                                         ("max", (1 << 20, "/proc/meminfo MemTotal")),
                                         (str(2 << 20), (1 << 20, "/proc/meminfo MemTotal")),
                                         (str(1 << 20), (1 << 20, "/proc/meminfo MemTotal"))])
def test_with_local_a_jobs_cgroup_limit_is_the_memory_only_where_it_is_smaller(tmp_path, limit, want):
    """`--local`: a job confined by a cgroup v2 `memory.max` below the node's MemTotal can use only
    that; `max` (no limit) or a limit at or above MemTotal leaves MemTotal as the budget."""
    from ckptdoctor.preflight import memory
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemFree:   10 kB\nMemTotal:  1024 kB\n")
    (proc / "self" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_7\n")
    (cg / "system.slice" / "slurmstepd.scope" / "job_7").mkdir(parents=True)
    (cg / "system.slice" / "slurmstepd.scope" / "job_7" / "memory.max").write_text(limit + "\n")
    assert memory._local_memory(str(proc), str(cg)) == memory.NodeMemory(*want)
