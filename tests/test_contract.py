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


# ---- issue 37: contracts that cannot be fooled or false-alarmed ------------------------------------
def test_data_behind_a_symlinked_directory_is_hashed_and_a_cycle_is_refused(tmp_path):
    from test_family_model import megatron as make_run
    root = tmp_path / "run"
    make_run(root)
    real = tmp_path / "store" / "tokens"
    real.mkdir(parents=True)
    (real / "part-0.bin").write_bytes(b"a" * 5000)
    data = tmp_path / "data"
    data.mkdir()
    (data / "tokens").symlink_to(real)            # the data set lives elsewhere, linked in
    rc, out, err = cli("contract", "init", str(root), "--data", str(data))
    assert rc == 0, err
    phase = json.loads((root / "ckptdoctor.contract.json").read_text())["phases"][0]
    assert str(data / "tokens" / "part-0.bin") in phase["data"]["files"]
    assert phase["data"]["links"] == {str(data / "tokens"): str(real)}
    (real / "part-0.bin").write_bytes(b"b" * 5000)   # re-tokenized in place, behind the link
    rc, doc, err = check(root)
    assert rc == 1 and ("CKD512", "part-0.bin", "changed") in changes(doc)
    (real / "loop").symlink_to(data)               # a cycle: data/tokens/loop -> data
    rc, out, err = cli("contract", "new-phase", str(root), "--reason", "x", "--data", str(data))
    assert rc == 2 and "cycle" in err and "Traceback" not in err


def _repo(path):
    path.mkdir(parents=True)
    (path / "a.py").write_text("x = 1\n")
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run([*GIT, "-C", str(path), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(path), "commit", "-qm", "c"], check=True)


def test_code_state_sees_nested_repos_and_a_second_edit_in_a_dirty_submodule(tmp_path):
    from test_family_model import megatron as make_run
    root, code = tmp_path / "run", tmp_path / "code"
    make_run(root)
    _repo(code)
    _repo(code / "vendor" / "nested")             # an untracked repository inside the code
    _repo(tmp_path / "libsrc")
    subprocess.run([*GIT, "-c", "protocol.file.allow=always", "-C", str(code), "submodule", "add", "-q",
                    str(tmp_path / "libsrc"), "lib"], check=True)
    subprocess.run([*GIT, "-C", str(code), "commit", "-qam", "sub"], check=True)
    (code / "lib" / "a.py").write_text("x = 2\n")  # the submodule is dirty before init
    assert cli("contract", "init", str(root), "--code", str(code))[0] == 0
    assert check(root)[0] == 0
    (code / "lib" / "a.py").write_text("x = 3\n")  # a second edit in the already-dirty submodule
    rc, doc, err = check(root)
    assert rc == 1 and [c[0] for c in changes(doc)] == ["CKD511"]
    assert any("lib" in f for f in doc["findings"][0]["details"]["files"])
    (code / "lib" / "a.py").write_text("x = 2\n")
    assert check(root)[0] == 0
    (code / "vendor" / "nested" / "a.py").write_text("x = 9\n")   # an edit inside the nested repo
    rc, doc, err = check(root)
    assert rc == 1 and any("vendor/nested" in f for f in doc["findings"][0]["details"]["files"])


def test_the_users_git_diff_config_is_no_code_change(run):
    code = run.parent / "code"
    (code / "train.py").write_text("print('edited')\n")   # uncommitted, recorded in a new phase
    assert cli("contract", "new-phase", str(run), "--reason", "hotfix")[0] == 0
    for key, val in (("diff.noprefix", "true"), ("diff.mnemonicPrefix", "true"), ("color.ui", "always")):
        subprocess.run([*GIT, "-C", str(code), "config", key, val], check=True)
        rc, doc, err = check(run)
        assert rc == 0, (key, doc["findings"])


def test_a_hand_edited_contract_is_refused(run):
    path = run / "ckptdoctor.contract.json"
    doc = json.loads(path.read_text())
    doc["phases"][-1]["recipe"] = {}                       # the recipe removed from the newest phase
    path.write_text(json.dumps(doc))
    (run.parent / "recipe.yaml").write_text("lr: 0.5\n")
    rc, doc, err = check(run)
    assert rc == 1 and [f["rule"] for f in doc["findings"]] == ["CKD510"]
    assert "edited by hand" in doc["findings"][0]["message"]


def test_findings_show_the_recipe_diff(run):
    (run.parent / "recipe.yaml").write_text("lr: 0.002\n")
    rc, doc, err = check(run)
    hit = [f for f in doc["findings"] if f["rule"] == "CKD513"][0]
    assert hit["details"]["diff"] == ["-lr: 0.001", "+lr: 0.002"] and "+lr: 0.002" in hit["message"]


def test_preflight_quick_data_check_catches_a_same_size_retokenization(run):
    """preflight compares size and mtime before re-hashing: data rewritten at the same size (a new
    mtime) must still be re-hashed and caught."""
    shard = run.parent / "data" / "shard-0.bin"
    shard.write_bytes(os.urandom(shard.stat().st_size))
    rc, out, err = cli("preflight", str(run), "--nodelist", "n1", "--ranks-per-node", "1", "-f", "json")
    assert rc == 1 and "CKD512" in {f["rule"] for f in json.loads(out)["findings"]}, err


def test_a_recipe_change_is_shown_as_a_diff_up_to_64_kib_and_named_beyond(tmp_path):
    """The contract keeps a recipe's text only up to 64 KiB (the contract stays small): a change to
    a 64 KiB recipe is shown line by line; one byte more and the change is still caught, by digest,
    without a diff."""
    for size, diffed in ((64 << 10, True), ((64 << 10) + 1, False)):
        root = tmp_path / f"run{size}"
        megatron(root)
        recipe = tmp_path / f"recipe{size}.yaml"
        head = "lr: 0.001\n"
        recipe.write_text(head + "#" * (size - len(head) - 1) + "\n")
        assert recipe.stat().st_size == size
        rc, out, err = cli("contract", "init", str(root), "--recipe", str(recipe))
        assert rc == 0, err
        recipe.write_text("lr: 0.002\n" + "#" * (size - len(head) - 1) + "\n")
        rc, doc, err = check(root)
        hit = [f for f in doc["findings"] if f["rule"] == "CKD513"][0]
        assert (hit["details"].get("diff") or []) == (["-lr: 0.001", "+lr: 0.002"] if diffed else []), size


def test_a_contract_written_by_an_earlier_version_still_sees_an_edit_or_a_new_file(run):
    """Contracts written before scheme 2 recorded the code as a hash of `git diff HEAD` plus the
    untracked files; checked today they are compared the same way, so an edited tracked file alone,
    or a new untracked file alone, is a code change (CKD511) -- either one, not only both."""
    from ckptdoctor.contract import code_state, phase_digest
    code = run.parent / "code"
    doc = json.loads((run / "ckptdoctor.contract.json").read_text())
    phase = {k: v for k, v in doc["phases"][0].items() if k != "digest"}
    phase["code"] = code_state(str(code), scheme=1)          # what that version wrote (and sealed)
    assert "scheme" not in phase["code"] and phase["code"]["uncommitted"] is None
    doc["phases"][0] = {**phase, "digest": phase_digest(phase)}
    (run / "ckptdoctor.contract.json").write_text(json.dumps(doc))
    rc, got, err = check(run)
    assert rc == 0, [f["message"] for f in got["findings"]]
    (code / "train.py").write_text("print('train, edited')\n")          # an edit, no new file
    rc, got, _ = check(run)
    assert rc == 1 and changes(got) == [("CKD511", "code", "changed")]
    subprocess.run([*GIT, "-C", str(code), "checkout", "-q", "--", "train.py"], check=True)
    assert check(run)[0] == 0
    (code / "helper.py").write_text("x = 1\n")                         # a new file, no edit
    rc, got, _ = check(run)
    assert rc == 1 and changes(got) == [("CKD511", "code", "changed")]
