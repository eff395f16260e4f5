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
from helpers import cli

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
    assert f["details"]["files"] == ["__1_0.distcp"] and "__1_0.distcp exists on n2" in f["hint"]


def test_per_rank_metadata_without_a_global_one(fixture_root, tmp_path):
    """A use_collectives=False save has only __{rank}.metadata files: torch 2.13 loads each rank
    from its own (no false alarm for the missing .metadata), and a rank whose file is gone fails."""
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
