"""preflight's read sets against the real thing: checkpoints saved by real multi-rank dcp.save over
gloo, copied node-locally the way node-local saving leaves them (each node: its ranks' files plus
`.metadata`), then loaded by the real multi-rank dcp.load with each rank reading its own node's
copy.  In every case the ranks preflight says cannot load are exactly the ranks whose load fails:
no false pass, no false alarm."""
import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import _run_script
from helpers import assert_fires_json, cli

pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _run(*args):
    _run_script("readsets_job.py", *args, timeout=600)  # the session fixtures' runner: one line of failure output


@pytest.fixture(scope="module")
def saves(tmp_path_factory):
    base = tmp_path_factory.mktemp("saves")
    made = {}

    def get(kind: str, world: int) -> Path:
        key = (kind, world)
        if key not in made:
            made[key] = base / f"{kind}-{world}"
            _run("save", kind, made[key], world)
        return made[key]
    return get


def _nodes(src: Path, root: Path, saved_per_node: int, nodes: list[str], full_copy: bool = False) -> Path:
    """Node i holds `.metadata` and the files of saved ranks i*per..(i+1)*per-1 (all files when
    full_copy); nodes past the saving ones hold only `.metadata` (replacement nodes)."""
    for i, n in enumerate(nodes):
        d = root / n
        d.mkdir(parents=True)
        for f in src.iterdir():
            if f.name.endswith(".distcp"):
                r = int(f.name[2:].split("_")[0])
                if not full_copy and r // saved_per_node != i:
                    continue
            shutil.copy2(f, d / f.name)
    return root


def _preflight_failing_ranks(root: Path, nodes: list[str], per_node: int) -> tuple[set[int], dict]:
    rc, out, err = cli("preflight", f"{root}/{{node}}", "--nodelist", ",".join(nodes), "--ranks-per-node",
                       str(per_node), "-f", "json")
    assert "Traceback" not in err, err
    doc = json.loads(out)
    ranks = {r for f in doc["findings"] if f["severity"] == "error" and f["rule"] in ("CKD401", "CKD402", "CKD403")
             for r in f["details"].get("ranks", [])}
    assert (rc == 0) == (not ranks), (rc, doc["findings"])
    return ranks, doc


def _load_failing_ranks(root: Path, nodes: list[str], per_node: int, tmp_path: Path) -> set[int]:
    dirs = [root / n for n in nodes for _ in range(per_node)]
    out = tmp_path / "load.json"
    _run("load", out, len(dirs), *dirs)
    return set(json.loads(out.read_text())["failed_ranks"])


CASES = [  # kind, saved world, saved ranks per node, new nodes, new ranks per node, full copy
    pytest.param("ddp-lowest", 2, 1, ["n1", "n2"], 1, False, id="replicated-dedup-to-lowest"),
    pytest.param("ddp-balanced", 4, 2, ["n1", "n2"], 2, False, id="replicated-balanced"),
    pytest.param("fsdp2-adamw", 2, 1, ["n1", "n2"], 1, False, id="fsdp2-adamw-one-step"),
    pytest.param("rows", 4, 2, ["n1", "n2"], 1, False, id="reshard-4-to-2"),
    pytest.param("rows", 4, 2, ["n1", "n2", "n3", "n4"], 2, False, id="reshard-4-to-8"),
    pytest.param("rows", 4, 2, ["n1", "n2"], 1, True, id="reshard-4-to-2-full-copies"),
    pytest.param("fsdp2-adamw", 2, 1, ["n1", "n2"], 1, True, id="fsdp2-full-copies"),
]


@pytest.mark.parametrize("kind, saved, saved_per, nodes, per, full", CASES)
def test_preflight_verdict_equals_the_real_load(saves, tmp_path, kind, saved, saved_per, nodes, per, full):
    root = _nodes(saves(kind, saved), tmp_path / "nodes", saved_per, nodes, full)
    said, doc = _preflight_failing_ranks(root, nodes, per)
    failed = _load_failing_ranks(root, nodes, per, tmp_path)
    assert said == failed, (said, failed, doc["findings"])
    if full:
        assert not failed  # every node has every file: no false alarm
    else:
        assert failed  # every split case here strands something: the test cannot pass vacuously
    if kind == "ddp-lowest":
        assert failed == {1}       # everything deduplicated into rank 0's file
    if kind == "fsdp2-adamw" and not full:
        assert failed == {0}       # the replicated AdamW steps and param_groups land in __1_0.distcp
    if "n3" in nodes:
        assert {4, 5, 6, 7} <= failed  # replacement nodes hold no saved rows


def test_findings_name_node_ranks_and_the_files_they_lack(saves, tmp_path):
    root = _nodes(saves("fsdp2-adamw", 2), tmp_path / "nodes", 1, ["n1", "n2"])
    _, doc = _preflight_failing_ranks(root, ["n1", "n2"], 1)
    (f,) = [f for f in doc["findings"] if f["rule"] == "CKD401"]
    assert f["details"]["node"] == "n1" and f["details"]["ranks"] == [0]
    assert f["details"]["files"] == ["__1_0.distcp"] and "__1_0.distcp is on n2" in f["hint"]


def test_per_rank_metadata_without_a_global_one(fixture_root, tmp_path):
    """A use_collectives=False save has only __{rank}.metadata files: torch 2.13 loads each rank
    from its own (no false alarm for the missing .metadata), and a rank whose file is gone, or
    shorter than its own metadata needs, fails."""
    src = fixture_root / "dcp_nocoll"
    assert not (src / ".metadata").exists()
    root = tmp_path / "nodes"
    for i, n in enumerate(["n1", "n2"]):
        (root / n).mkdir(parents=True)
        for f in src.iterdir():
            if int(f.name[2:].split(".")[0].split("_")[0]) // 2 == i:  # __R.metadata and __R_0.distcp
                shutil.copy2(f, root / n / f.name)
    said, doc = _preflight_failing_ranks(root, ["n1", "n2"], 2)
    assert said == set() == _load_failing_ranks(root, ["n1", "n2"], 2, tmp_path), doc["findings"]
    os.remove(root / "n2" / "__3_0.distcp")
    said, doc = _preflight_failing_ranks(root, ["n1", "n2"], 2)
    assert said == {3} == _load_failing_ranks(root, ["n1", "n2"], 2, tmp_path), doc["findings"]
    shutil.copy2(src / "__3_0.distcp", root / "n2" / "__3_0.distcp")   # back, but cut short: what rank 3's
    os.truncate(root / "n2" / "__3_0.distcp", os.path.getsize(src / "__3_0.distcp") // 2)  # own metadata needs
    said, doc = _preflight_failing_ranks(root, ["n1", "n2"], 2)
    assert said == {3} == _load_failing_ranks(root, ["n1", "n2"], 2, tmp_path), doc["findings"]
    assert {f["rule"] for f in doc["findings"] if f["severity"] == "error"} == {"CKD402", "CKD406"}, doc["findings"]


# ---- issue 36: a rank reads only the keys of its own load state dict --------------------------------
JOB_CASES = [  # kind, saved world, nodes of the new allocation, ranks per node
    pytest.param("rank-keys", 2, ["n1", "n2"], 1, id="rank-unique-keys"),
    pytest.param("fsdp2-dl", 2, ["n1", "n2"], 1, id="fsdp2-adamw-per-rank-dataloader"),
    pytest.param("fsdp2-dl-lowest", 2, ["n1", "n2"], 1, id="fsdp2-dataloader-dedup-to-lowest"),
    pytest.param("rows-rank-keys", 4, ["n1", "n2"], 1, id="reshard-4-to-2-per-rank-keys"),
    pytest.param("dp-groups", 4, ["n1", "n2"], 2, id="dp-groups-name-is-not-the-rank"),
]


@pytest.fixture(scope="module")
def job_saves(tmp_path_factory):
    base = tmp_path_factory.mktemp("jobsaves")
    made = {}

    def get(kind: str, world: int) -> Path:
        if kind not in made:
            made[kind] = base / kind
            _run("save", kind, made[kind], world, "record")  # through ManifestWriter: the read plan recorded
        return made[kind]
    return get


def _splits(src: Path, saved: int, nodes: list[str]) -> dict[str, dict[str, list[str]]]:
    """Layouts to load: every node with every file; each node with only its own saved ranks' files;
    and every file removed from one node at a time."""
    shards = sorted(f.name for f in src.iterdir() if f.name.endswith(".distcp"))
    per = max(1, saved // len(nodes))
    out = {"full": {n: shards for n in nodes},
           "own": {n: [f for f in shards if int(f[2:].split("_")[0]) // per == i] for i, n in enumerate(nodes)}}
    for n in nodes:
        for f in shards:
            out[f"{n}-without-{f}"] = {m: [x for x in shards if not (m == n and x == f)] for m in nodes}
    return out


def _preflight_ranks(root: Path, nodes: list[str], per: int, *extra) -> tuple[set[int], set[int], dict]:
    rc, out, err = cli("preflight", f"{root}/{{node}}", "--nodelist", ",".join(nodes), "--ranks-per-node",
                       str(per), "-f", "json", *extra)
    assert "Traceback" not in err, err
    doc = json.loads(out)
    errors = {r for f in doc["findings"] if f["severity"] == "error" and f["rule"] in ("CKD401", "CKD402", "CKD403")
              for r in f["details"].get("ranks", [])}
    warned = {r for f in doc["findings"] if f["rule"] == "CKD411" for r in f["details"]["ranks"]}
    assert all(f["severity"] == "warning" for f in doc["findings"] if f["rule"] == "CKD411"), doc["findings"]
    assert (rc == 0) == (not errors), (rc, doc["findings"])
    return errors, warned, doc


@pytest.mark.parametrize("kind, saved, nodes, per", JOB_CASES)
def test_preflight_equals_each_ranks_real_load_with_and_without_a_recorded_plan(job_saves, tmp_path, kind, saved,
                                                                               nodes, per):
    """Every layout is loaded for real (each rank from its own node's copy, asking for its own keys);
    preflight with the save's recorded read plan names exactly the ranks whose load fails; without it
    (evidence from the names) it never errors on a rank that loads and never stays silent on one that
    does not (an undecided key may warn, CKD411)."""
    src = job_saves(kind, saved)
    splits = _splits(src, saved, nodes)
    dirs = {}
    for case, layout in splits.items():
        for n, files in layout.items():
            d = tmp_path / case / n
            d.mkdir(parents=True)
            for f in [".metadata", *files]:
                shutil.copy2(src / f, d / f)
        dirs[case] = [str(tmp_path / case / n) for n in nodes for _ in range(per)]
    (tmp_path / "cases.json").write_text(json.dumps(list(dirs.values())))
    _run("loads", tmp_path / "loads.json", kind, len(nodes) * per, tmp_path / "cases.json")
    failed = dict(zip(dirs, (set(x) for x in json.loads((tmp_path / "loads.json").read_text())["failed_ranks"])))
    assert failed["full"] == set(), "every node holding every file must load"
    assert any(failed.values()), "some layout here strands a rank: the test cannot pass vacuously"
    assert any(not failed[c] for c in splits if c != "full"), "some partial layout loads: false alarms are tested"
    for case in splits:
        root = tmp_path / case
        errors, warned, doc = _preflight_ranks(root, nodes, per)            # evidence only
        assert errors <= failed[case], (case, "false alarm", failed[case], doc["findings"])
        assert failed[case] <= errors | warned, (case, "false pass", failed[case], doc["findings"])
        if kind != "dp-groups":  # names that carry the global rank decide exactly
            assert (errors, warned) == (failed[case], set()), (case, failed[case], doc["findings"])
        elif case == "n1-without-__2_0.distcp":  # a data-parallel rank in the name: undecided, said so
            assert not errors and warned == {0, 1}, doc["findings"]
            (hit,) = assert_fires_json(doc, "CKD411", path_contains="n1")
            assert hit["severity"] == "warning" and hit["details"]["keys"] == ["dataloader.dp_rank_1.pos"]
            assert hit["details"]["file"] == "__2_0.distcp" and "--read-plan" in hit["hint"]
        for n in nodes:
            shutil.copy2(src / "ckptdoctor.manifest.json", root / n / "ckptdoctor.manifest.json")
        errors, warned, doc = _preflight_ranks(root, nodes, per)            # the recorded plan
        assert (errors, warned) == (failed[case], set()), (case, failed[case], doc["findings"])
        nodes_named = {f["details"]["node"] for f in doc["findings"] if f["rule"] in ("CKD401", "CKD403")}
        assert nodes_named == {n for i, n in enumerate(nodes) if set(range(i * per, (i + 1) * per)) & failed[case]}
    if kind == "rank-keys":
        assert failed["own"] == {0}          # the replicated `step` and `shared.w` sit in __1_0 only
        assert failed["n1-without-__1_0.distcp"] == {0} and failed["n2-without-__0_0.distcp"] == set()
    if kind == "rows-rank-keys":
        assert failed["n1-without-__3_0.distcp"] == set()   # old rank 3's keys are never read at world 2
    if kind == "dp-groups":  # dp_rank_0 in __0_0 (read by ranks 0,1), dp_rank_1 in __2_0 (ranks 2,3)
        assert failed["n1-without-__2_0.distcp"] == set() and failed["n1-without-__0_0.distcp"] == {0, 1}


def test_read_plan_file_decides_what_a_manifestless_copy_cannot(job_saves, tmp_path):
    """--read-plan FILE gives the save's record from elsewhere (a copy without the manifest): the
    dp-groups split that evidence can only warn about is decided exactly."""
    src = job_saves("dp-groups", 4)
    for n, ranks in (("n1", (0, 1)), ("n2", (2, 3))):
        (tmp_path / "nodes" / n).mkdir(parents=True)
        for f in src.iterdir():
            if f.name == ".metadata" or (f.name.endswith(".distcp") and int(f.name[2:].split("_")[0]) in ranks):
                shutil.copy2(f, tmp_path / "nodes" / n / f.name)
    errors, warned, _ = _preflight_ranks(tmp_path / "nodes", ["n1", "n2"], 2)
    plan = json.loads((src / "ckptdoctor.manifest.json").read_text())["read_plan"]
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    errors2, warned2, doc = _preflight_ranks(tmp_path / "nodes", ["n1", "n2"], 2, "--read-plan", str(tmp_path / "plan.json"))
    (tmp_path / "cases.json").write_text(json.dumps([[str(tmp_path / "nodes" / n) for n in ("n1", "n1", "n2", "n2")]]))
    _run("loads", tmp_path / "loads.json", "dp-groups", 4, tmp_path / "cases.json")
    (failed,) = json.loads((tmp_path / "loads.json").read_text())["failed_ranks"]
    assert (errors2, warned2) == (set(failed), set()), doc["findings"]
    assert errors <= set(failed) <= errors | warned


def _md(records):
    """A DcpMetadata of bytes items: (fqn, file) pairs."""
    from ckptdoctor.layouts.dcp import DcpMetadata, StorageEntry
    md = DcpMetadata()
    for i, (fqn, rel) in enumerate(records):
        md.storage.append(StorageEntry(fqn, None, rel, 0, 10 + i))
        md.byte_keys.add(fqn)
    return md


def test_evidence_rules_for_keys_saved_once():
    """The evidence model, record by record: a rank in the name that is its file's rank for every saved
    rank is per-rank; a number past the saved world (`lora_rank_16`) is not a rank; ShardedObject
    shards one per saved rank are per-rank, fewer shards than ranks (data-parallel replicas) are
    undecided; a recorded plan of another world is not used."""
    from ckptdoctor.preflight import readsets as R
    md = _md([("rng.rank_0", "__0_0.distcp"), ("rng.rank_1", "__1_0.distcp"), ("cfg.lora_rank_16", "__1_0.distcp"),
              ("rng_state/shard_0.0_1.2", "__0_0.distcp"), ("rng_state/shard_0.1_1.2", "__1_0.distcp")])
    rs = R.plan(md, 2, set())
    assert rs.model == "evidence" and rs.files(0) == {"__0_0.distcp", "__1_0.distcp"}
    assert rs.files(1) == {"__1_0.distcp"}
    assert rs.by_rank == {0: {"__0_0.distcp"}, 1: {"__1_0.distcp"}} and rs.every_rank == {"__1_0.distcp"}
    assert not rs.undecided
    md = _md([("rng.rank_0", "__0_0.distcp"), ("rng.rank_1", "__1_0.distcp")])
    rs = R.plan(md, 2, set())
    assert rs.files(0) == {"__0_0.distcp"} and rs.files(1) == {"__1_0.distcp"} and not rs.undecided
    rs = R.plan(md, 1, set())  # resharded 2 -> 1: old rank 1's key is read by no one
    assert rs.files(0) == {"__0_0.distcp"}
    md4 = _md([("rng_state/shard_0.0_1.2", "__0_0.distcp"), ("rng_state/shard_0.1_1.2", "__1_0.distcp"),
               ("x", "__2_0.distcp"), ("y", "__3_0.distcp")])
    rs = R.plan(md4, 4, set())  # TP=2 x DP=2: each shard is read by its writer and one unknown replica
    assert rs.maybe(2) == {"__0_0.distcp": rs.undecided["__0_0.distcp"], "__1_0.distcp": rs.undecided["__1_0.distcp"]}
    assert 0 not in rs.undecided["__0_0.distcp"].ranks and "ShardedObject" in rs.undecided["__0_0.distcp"].why
    plan = R.parse_read_plan(R.read_plan_record(3, [["rng.rank_0"], ["rng.rank_1"], []]), "t")
    rs = R.plan(md, 2, set(), recorded=plan)
    assert rs.model == "evidence"  # a record of a 3-rank save does not describe this 2-rank one
    with pytest.raises(R.ReadPlanError):
        R.parse_read_plan({"schema": R.READ_PLAN_SCHEMA, "world": 2, "keys": {"a": [2]}}, "t")


@pytest.mark.parametrize("ranks", [[2], [5], [0, 7], [-1], [True], [], "some", [1.0]])
def test_a_read_plan_naming_a_rank_outside_its_world_is_refused(ranks):
    """A recorded read plan is trusted to say which ranks read a key: one naming a rank the save did
    not have (or no rank, or not a rank) is refused with the key named, never used to clear a node."""
    from ckptdoctor.preflight import readsets as R
    with pytest.raises(R.ReadPlanError, match="key 'a'"):
        R.parse_read_plan({"schema": R.READ_PLAN_SCHEMA, "world": 2, "keys": {"a": ranks}}, "t")
    assert R.parse_read_plan({"schema": R.READ_PLAN_SCHEMA, "world": 2, "keys": {"a": [0, 1]}}, "t").holders == \
        {"a": frozenset({0, 1})}


@pytest.mark.parametrize("world", [0, -1, -4, 10_000_001, True, 2.0, "2", None])
def test_a_read_plan_whose_world_is_not_a_positive_rank_count_is_refused(world):
    """A recorded read plan's world is how many ranks saved: zero, a negative count, more than ten
    million, or anything but an integer is refused (never a plan that clears no rank or every one);
    a positive count is read."""
    from ckptdoctor.preflight import readsets as R
    with pytest.raises(R.ReadPlanError, match="'world' must be a positive integer"):
        R.parse_read_plan({"schema": R.READ_PLAN_SCHEMA, "world": world, "keys": {}}, "t")
    for ok in (1, 3):
        assert R.parse_read_plan({"schema": R.READ_PLAN_SCHEMA, "world": ok, "keys": {"a": [0]}}, "t").holders == \
            {"a": frozenset({0})}
