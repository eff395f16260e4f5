"""The run contract: each kind of change is named (code: commit and uncommitted changes, data:
content / removed / added, recipe, total steps); a declared new phase makes it hold again and
leaves earlier phases as they were; preflight enforces it; nothing switches it off."""
import json
import os
import subprocess

import pytest

from helpers import assert_fires_json, cli
from test_family_model import megatron

GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]


@pytest.fixture
def run(tmp_path):
    """A Megatron run root, a git repo of code, two data files and a recipe; the contract made."""
    root = tmp_path / "run"
    megatron(root)
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('train')\n")
    subprocess.run(["git", "init", "-q", str(code)], check=True)
    subprocess.run([*GIT, "-C", str(code), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(code), "commit", "-qm", "init"], check=True)
    data = tmp_path / "data"
    data.mkdir()
    (data / "shard-0.bin").write_bytes(os.urandom(100_000))
    (data / "shard-1.bin").write_bytes(os.urandom(70_000))
    (tmp_path / "recipe.yaml").write_text("lr: 0.001\n")
    rc, out, err = cli("contract", "init", str(root), "--code", str(code), "--data", str(data),
                       "--recipe", str(tmp_path / "recipe.yaml"), "--total-steps", "1000")
    assert rc == 0, err
    return root


def check(root, *args):
    rc, out, err = cli("contract", "check", str(root), "-f", "json", *args)
    assert "Traceback" not in err, err
    doc = json.loads(out) if out.strip() else None
    return rc, doc, err


def changes(doc):
    for rule in {f["rule"] for f in doc["findings"]}:
        assert_fires_json(doc, rule)  # the catalog's coverage check counts each rule seen here
    return sorted((f["rule"], os.path.basename(f["details"]["item"]), f["details"]["change"]) for f in doc["findings"])


def test_unchanged_run_holds(run):
    rc, doc, _ = check(run, "--total-steps", "1000")
    assert rc == 0 and doc["findings"] == []
    assert doc["facts"]["contract"]["data_files"] == 2 and doc["facts"]["contract"]["phase"] == 0


def test_data_content_change_with_same_size_and_mtime(run):
    f = run.parent / "data" / "shard-0.bin"
    st = f.stat()
    with open(f, "r+b") as fh:
        fh.seek(50_000)
        fh.write(b"\x00\x01")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    rc, doc, _ = check(run)
    assert rc == 1 and changes(doc) == [("CKD512", "shard-0.bin", "changed")]


def test_removed_and_added_data_files(run):
    os.remove(run.parent / "data" / "shard-1.bin")
    (run.parent / "data" / "shard-2.bin").write_bytes(b"new")
    rc, doc, _ = check(run)
    assert rc == 1 and changes(doc) == [("CKD512", "shard-1.bin", "removed"), ("CKD512", "shard-2.bin", "added")]


def test_recipe_and_total_steps(run):
    (run.parent / "recipe.yaml").write_text("lr: 0.002\n")
    rc, doc, _ = check(run, "--total-steps", "1200")
    assert rc == 1 and changes(doc) == [("CKD513", "recipe.yaml", "changed"), ("CKD514", "total_steps", "changed")]
    f = next(f for f in doc["findings"] if f["rule"] == "CKD514")
    assert (f["details"]["was"], f["details"]["now"]) == ("1000", "1200")


def test_uncommitted_code_change_then_a_new_commit(run):
    code = run.parent / "code"
    (code / "train.py").write_text("print('train, fixed')\n")
    rc, doc, _ = check(run)
    assert rc == 1 and changes(doc) == [("CKD511", "code", "changed")]
    assert "uncommitted" in doc["findings"][0]["details"]["now"]
    subprocess.run([*GIT, "-C", str(code), "commit", "-qam", "fix"], check=True)
    rc, doc, _ = check(run)
    assert rc == 1 and changes(doc) == [("CKD511", "code", "changed")]
    assert "uncommitted" not in doc["findings"][0]["details"]["now"]
    (code / "new_module.py").write_text("x = 1\n")  # untracked files count as uncommitted changes
    subprocess.run([*GIT, "-C", str(code), "reset", "-q", "--hard", "HEAD~1"], check=True)
    rc, doc, _ = check(run)
    assert rc == 1 and "uncommitted" in doc["findings"][0]["details"]["now"]


def test_a_declared_new_phase_holds_and_keeps_the_earlier_phase(run):
    before = json.loads((run / "ckptdoctor.contract.json").read_text())["phases"][0]
    (run.parent / "recipe.yaml").write_text("lr: 0.002\n")
    (run.parent / "data" / "shard-2.bin").write_bytes(b"more")
    rc, out, err = cli("contract", "new-phase", str(run), "--reason", "lower LR after spike", "--total-steps", "1200")
    assert rc == 0, err
    doc = json.loads((run / "ckptdoctor.contract.json").read_text())
    assert doc["phases"][0] == before and len(doc["phases"]) == 2
    assert doc["phases"][1]["reason"] == "lower LR after spike" and doc["phases"][1]["total_steps"] == 1200
    rc, doc, _ = check(run, "--total-steps", "1200")
    assert rc == 0 and doc["findings"] == []
    rc, doc, _ = check(run, "--total-steps", "1000")  # the old length is now the change
    assert rc == 1 and changes(doc) == [("CKD514", "total_steps", "changed")]


def test_init_refuses_an_existing_contract_and_new_phase_needs_a_reason(run):
    rc, out, err = cli("contract", "init", str(run), "--total-steps", "5")
    assert rc == 2 and "new-phase" in err
    rc, out, err = cli("contract", "new-phase", str(run), "--reason", " ")
    assert rc == 2 and "--reason" in err


def test_preflight_enforces_the_contract_and_it_cannot_be_switched_off(run):
    (run.parent / "recipe.yaml").write_text("lr: 0.002\n")
    base = ["preflight", str(run), "--nodelist", "n1", "--ranks-per-node", "1", "-f", "json"]
    rc, out, err = cli(*base)
    doc = json.loads(out)
    assert rc == 1 and [f["rule"] for f in doc["findings"] if f["severity"] == "error"] == ["CKD513"], err
    assert doc["facts"]["contract"]["phase"] == 0
    rc, out, err = cli(*base, "--total-steps", "900")
    assert {f["rule"] for f in json.loads(out)["findings"]} == {"CKD513", "CKD514"}
    for extra in (["--ignore", "CKD513"], ["--ignore", "contract-recipe-changed"], ["--severity", "CKD513=info"]):
        rc, out, err = cli(*base, *extra)
        assert rc == 2 and "cannot be" in err, (extra, err)
    rc, out, err = cli(*base, "--select", "CKD4")  # selecting other rules does not drop it either
    assert rc == 1 and "CKD513" in {f["rule"] for f in json.loads(out)["findings"]}
    cfg = run.parent / "ckptdoctor.toml"
    cfg.write_text('ignore = ["CKD513"]\n')
    rc, out, err = cli(*base, "--config", str(cfg))
    assert rc == 2 and "cannot be ignored" in err


def test_unreadable_contract_is_an_error_not_a_pass(run):
    (run / "ckptdoctor.contract.json").write_text('{"format": "ckptdoctor.contract/v1", "phases": [{"index": 0}]}')
    rc, doc, _ = check(run)
    assert rc == 1 and [f["rule"] for f in doc["findings"]] == ["CKD510"]
    assert_fires_json(doc, "CKD510", path_contains="ckptdoctor.contract.json")
    assert "phase 0 is malformed" in doc["findings"][0]["message"]
    rc, out, err = cli("preflight", str(run), "--nodelist", "n1", "--ranks-per-node", "1", "-f", "json")
    assert rc == 1 and "CKD510" in {f["rule"] for f in json.loads(out)["findings"]}
