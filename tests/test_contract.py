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


# ---- generated survivors of the contract group (session 22): each test states the promise -------
def _contract(tmp_path, **kw):
    """contract.init in-process on a fresh run root (faster than the CLI for the many cases here)."""
    from ckptdoctor import contract as C
    root = tmp_path / "run"
    root.mkdir(exist_ok=True)
    return C.init(str(root), kw.get("code"), [str(p) for p in kw.get("data", [])],
                  [str(p) for p in kw.get("recipe", [])], kw.get("total_steps"))


def _what(changes):
    return sorted((c.kind, os.path.basename(c.item), c.change) for c in changes)


def test_a_small_files_recorded_digest_is_its_xxh3_128_so_xxhsum_can_confirm_it(tmp_path):
    import xxhash
    f = tmp_path / "tok.bin"
    f.write_bytes(b"tokens" * 1000)
    c = _contract(tmp_path, data=[f])
    assert c.newest.data["files"][str(f)]["xxh3_128"] == xxhash.xxh3_128(f.read_bytes()).hexdigest()


def test_a_change_past_the_first_64_mib_of_a_data_file_is_caught(tmp_path):
    from ckptdoctor import contract as C
    f = tmp_path / "big.bin"
    with open(f, "wb") as fh:
        fh.truncate((64 << 20) + 4096)
    c = _contract(tmp_path, data=[f])
    with open(f, "r+b") as fh:
        fh.seek((64 << 20) + 100)
        fh.write(b"\x01")
    assert _what(C.compare(c.newest)) == [("data", "big.bin", "changed")]


def test_data_in_a_directory_listed_after_a_skipped_one_is_hashed(tmp_path):
    from ckptdoctor import contract as C
    data = tmp_path / "data"
    (data / ".git").mkdir(parents=True)         # skipped (sorted before the data directory)
    (data / "train").mkdir()
    (data / "train" / "part-0.bin").write_bytes(b"a" * 100)
    c = _contract(tmp_path, data=[data])
    assert str(data / "train" / "part-0.bin") in c.newest.data["files"]
    (data / "train" / "part-0.bin").write_bytes(b"b" * 100)
    assert _what(C.compare(c.newest)) == [("data", "part-0.bin", "changed")]


def test_more_data_files_than_the_limit_is_an_error_naming_the_path(tmp_path, monkeypatch):
    from ckptdoctor import contract as C
    from ckptdoctor.engine.errors import InputError
    data = tmp_path / "data"
    data.mkdir()
    for i in range(5):
        (data / f"p{i}").write_bytes(b"x")
    monkeypatch.setattr(C, "MAX_FILES", 3)
    with pytest.raises(InputError, match=r"data: more than 3 files"):
        C.expand([str(data)])
    monkeypatch.setattr(C, "MAX_FILES", 5)
    assert len(C.expand([str(data)])) == 5


def test_a_git_killed_by_a_signal_is_not_believed(tmp_path, monkeypatch):
    """`git rev-parse HEAD` that prints a commit and then dies by a signal: its output is not the
    code's commit (the code is recorded as a tree of files instead)."""
    from ckptdoctor import contract as C
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "git").write_text("#!/bin/sh\necho 0123456789abcdef0123456789abcdef01234567\nkill -KILL $$\n")
    (fake / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    code = tmp_path / "code"
    code.mkdir()
    (code / "a.py").write_text("x = 1\n")
    st = C.code_state(str(code))
    assert st["kind"] == "tree" and st["files"] == 1


def _nest(top, levels):
    """`levels` repositories, each an untracked directory of the one above (top is the first)."""
    d = top
    for _ in range(levels):
        _repo(d)
        d = d / "inner"
    return top


@pytest.mark.parametrize("levels, refused", [(9, False), (10, True)])
def test_repositories_nested_nine_deep_are_followed_and_ten_deep_refused(tmp_path, levels, refused):
    from ckptdoctor import contract as C
    from ckptdoctor.engine.errors import InputError
    top = _nest(tmp_path / "code", levels)
    if refused:
        with pytest.raises(InputError, match="nested more than 8 deep"):
            C.code_state(str(top))
        return
    st = C.code_state(str(top))
    deepest = "/".join(["inner"] * (levels - 1))
    (top / deepest / "a.py").write_text("x = 2\n")              # an edit in the deepest repository
    assert C.code_str(C.code_state(str(top))) != C.code_str(st)


def _scheme1(tmp_path, code):
    """A contract as written before scheme 2 (code hashed from `git diff HEAD` + untracked files)."""
    from ckptdoctor import contract as C
    c = _contract(tmp_path, code=str(code))
    ph = c.newest
    ph.code = C.code_state(str(code), scheme=1)
    assert "scheme" not in ph.code
    return ph


def test_an_earlier_versions_contract_sees_an_untracked_files_content_change_and_nothing_when_unchanged(tmp_path):
    from ckptdoctor import contract as C
    code = tmp_path / "code"
    _repo(code)
    (code / "a.py").write_text("x = 5\n")          # dirty when recorded
    (code / "new.py").write_text("y = 1\n")        # untracked when recorded
    ph = _scheme1(tmp_path, code)
    assert C.compare(ph) == [], "an unchanged dirty tree was reported changed (compared with the wrong scheme)"
    (code / "new.py").write_text("y = 2\n")
    assert _what(C.compare(ph)) == [("code", "code", "changed")]


def test_a_one_character_untracked_file_is_part_of_the_code_state(tmp_path):
    from ckptdoctor import contract as C
    code = tmp_path / "code"
    _repo(code)
    (code / "x").write_text("1\n")
    st = C.code_state(str(code))
    assert "x" in st["uncommitted_files"]
    (code / "x").write_text("2\n")
    assert C.code_str(C.code_state(str(code))) != C.code_str(st)


def test_a_deleted_code_file_is_recorded_as_deleted(tmp_path):
    from ckptdoctor import contract as C
    code = tmp_path / "code"
    _repo(code)
    os.remove(code / "a.py")
    assert C.code_state(str(code))["uncommitted_files"] == {"a.py": "D deleted"}


def test_a_nested_repository_is_recorded_by_its_own_commit_so_a_new_commit_there_is_a_change(tmp_path):
    from ckptdoctor import contract as C
    code = tmp_path / "code"
    _repo(code)
    _repo(code / "vendor")
    st = C.code_state(str(code))
    assert st["uncommitted_files"]["vendor"].startswith("repo git ")
    subprocess.run([*GIT, "-C", str(code / "vendor"), "commit", "-q", "--allow-empty", "-m", "e"], check=True)
    assert C.code_str(C.code_state(str(code))) != C.code_str(st)


def test_a_code_directory_that_stopped_being_a_repository_is_a_change_not_a_crash(tmp_path):
    import shutil
    from ckptdoctor import contract as C
    code = tmp_path / "code"
    _repo(code)
    c = _contract(tmp_path, code=str(code))
    shutil.rmtree(code / ".git")
    ch = C.compare(c.newest)
    assert _what(ch) == [("code", "code", "changed")] and ch[0].now.startswith("tree ")


def test_the_files_changed_between_the_recorded_and_the_current_commit_and_uncommitted_are_named_up_to_100(tmp_path):
    from ckptdoctor import contract as C
    code = tmp_path / "code"
    _repo(code)
    c = _contract(tmp_path, code=str(code))
    for i in range(105):
        (code / f"m{i:03d}.py").write_text(f"v = {i}\n")
    subprocess.run([*GIT, "-C", str(code), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(code), "commit", "-qm", "many"], check=True)
    ch = C.compare(c.newest)
    assert [x.kind for x in ch] == ["code"]
    assert list(ch[0].files) == [f"m{i:03d}.py" for i in range(100)]
    c = C.new_phase(str(tmp_path / "run"), "many", None, None, None, None)
    for i in range(105):
        (code / f"u{i:03d}.py").write_text("new\n")             # uncommitted: named up to 100 too
    ch = C.compare(c.newest)
    assert list(ch[0].files) == [f"u{i:03d}.py (uncommitted)" for i in range(100)]


def test_an_unreadable_or_foreign_contract_file_is_a_one_line_error_naming_it(tmp_path, monkeypatch):
    from ckptdoctor import contract as C
    p = tmp_path / C.NAME
    p.mkdir()
    with pytest.raises(C.ContractError, match=r"cannot read \(.*directory.*\)$") as ei:
        C.load(str(p))
    assert "Errno" not in str(ei.value)
    p.rmdir()
    p.write_text("{not json")
    with pytest.raises(C.ContractError, match="not JSON"):
        C.load(str(p))
    p.write_text(json.dumps({"format": "other/v9", "phases": [{"index": 0}]}))
    with pytest.raises(C.ContractError, match="not a ckptdoctor.contract/v1 file"):
        C.load(str(p))
    p.write_text(json.dumps({"format": C.FORMAT, "phases": [{}] * 3}))
    monkeypatch.setattr(C, "MAX_BYTES", 16)
    with pytest.raises(C.ContractError, match=f"{p.name}: .*16-byte limit"):
        C.load(str(p))


@pytest.mark.parametrize("field, bad", [("code", "a string"), ("recipe_text", ["a list"]), ("recipe", []),
                                        ("total_steps", "10"), ("index", 3)])
def test_a_phase_with_a_field_of_the_wrong_type_is_malformed_even_when_its_digest_matches(tmp_path, field, bad):
    from ckptdoctor import contract as C
    c = _contract(tmp_path)
    doc = json.loads(open(c.path).read())
    ph = {k: v for k, v in doc["phases"][0].items() if k != "digest"}
    ph[field] = bad
    doc["phases"][0] = {**ph, "digest": C.phase_digest(ph)}
    open(c.path, "w").write(json.dumps(doc))
    with pytest.raises(C.ContractError, match="phase 0 is malformed"):
        C.load(c.path)


def test_a_contract_written_before_phases_carried_digests_still_loads(tmp_path):
    from ckptdoctor import contract as C
    c = _contract(tmp_path)
    doc = json.loads(open(c.path).read())
    doc["phases"] = [{k: v for k, v in p.items() if k != "digest"} for p in doc["phases"]]
    open(c.path, "w").write(json.dumps(doc))
    assert len(C.load(c.path).phases) == 1


def test_init_that_loses_a_race_with_another_init_says_so_and_keeps_the_winners_contract(tmp_path, monkeypatch):
    """Two `contract init` at once: the second to write refuses (UsageError), the first's file stays."""
    from ckptdoctor import contract as C
    from ckptdoctor.engine.errors import UsageError
    root = tmp_path / "run"
    root.mkdir()
    real = C.make_phase

    def racing(*a, **k):
        ph = real(*a, **k)
        (root / C.NAME).write_bytes(b"the other init's contract")   # it wrote between our check and write
        return ph
    monkeypatch.setattr(C, "make_phase", racing)
    with pytest.raises(UsageError, match="written meanwhile"):
        C.init(str(root), None, [], [], None)
    assert (root / C.NAME).read_bytes() == b"the other init's contract"


def test_new_phase_replaces_the_recipe_given_and_carries_over_the_one_not_given(tmp_path):
    from ckptdoctor import contract as C
    r1, r2 = tmp_path / "a.yaml", tmp_path / "b.yaml"
    r1.write_text("lr: 1\n")
    r2.write_text("lr: 2\n")
    c = _contract(tmp_path, recipe=[r1])
    c = C.new_phase(str(tmp_path / "run"), "other recipe", None, None, [str(r2)], None)
    assert list(c.newest.recipe) == [str(r2)]
    c = C.new_phase(str(tmp_path / "run"), "steps", None, None, None, 500)
    assert list(c.newest.recipe) == [str(r2)] and c.newest.total_steps == 500


def test_contract_check_rehashes_data_whose_size_and_mtime_are_unchanged(tmp_path):
    """`contract check` (not preflight's quick look) trusts no stat: same size, same mtime, new bytes."""
    from ckptdoctor import contract as C
    f = tmp_path / "d.bin"
    f.write_bytes(b"a" * 1000)
    c = _contract(tmp_path, data=[f])
    st = f.stat()
    f.write_bytes(b"b" * 1000)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _what(C.compare(c.newest)) == [("data", "d.bin", "changed")]


def test_the_quick_data_check_rehashes_exactly_the_files_whose_size_or_mtime_changed(tmp_path, monkeypatch):
    from ckptdoctor import contract as C
    same, grown = tmp_path / "same.bin", tmp_path / "grown.bin"
    same.write_bytes(b"a" * 1000)
    grown.write_bytes(b"a" * 1000)
    c = _contract(tmp_path, data=[same, grown])
    st = grown.stat()
    grown.write_bytes(b"a" * 1001)
    os.utime(grown, ns=(st.st_atime_ns, st.st_mtime_ns))      # a new size, the old mtime
    hashed = []
    real = C.hash_files
    monkeypatch.setattr(C, "hash_files", lambda paths, **k: (hashed.extend(paths), real(paths, **k))[1])
    assert _what(C.compare(c.newest, quick_data=True)) == [("data", "grown.bin", "changed")]
    assert hashed == [str(grown)]


def test_a_data_link_repointed_or_removed_is_named_and_an_unchanged_one_is_not(tmp_path):
    from ckptdoctor import contract as C
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "p.bin").write_bytes(b"same")
    data = tmp_path / "data"
    data.mkdir()
    (data / "tokens").symlink_to(a)
    c = _contract(tmp_path, data=[data])
    assert C.compare(c.newest) == []
    for now in (b, a.parent / "0-sorts-first"):               # whichever way the new target sorts
        (now / "p.bin").parent.mkdir(exist_ok=True)
        (now / "p.bin").write_bytes(b"same")
        (data / "tokens").unlink()
        (data / "tokens").symlink_to(now)
        ch = [x for x in C.compare(c.newest) if x.item.endswith("tokens")]
        assert [(x.change, x.now) for x in ch] == [("changed", f"link to {now}")]
    (data / "tokens").unlink()
    ch = [x for x in C.compare(c.newest) if x.item.endswith("tokens")]
    assert [(x.change, x.now) for x in ch] == [("removed", None)]


def test_new_phase_leaves_the_earlier_phases_text_byte_for_byte(tmp_path):
    from ckptdoctor import contract as C
    c = _contract(tmp_path, total_steps=5)
    before = open(c.path).read()
    C.new_phase(str(tmp_path / "run"), "longer", None, None, None, 10)
    after = open(c.path).read()
    phase0_end = before.rindex("}", 0, before.rindex("]")) + 1
    assert after.startswith(before[:phase0_end] + ",")


def test_a_phase_without_a_digest_after_a_signed_one_is_refused_as_hand_edited(tmp_path):
    from ckptdoctor import contract as C
    _contract(tmp_path)
    C.new_phase(str(tmp_path / "run"), "more steps", None, None, None, 10)
    path = tmp_path / "run" / C.NAME
    doc = json.loads(path.read_text())
    del doc["phases"][1]["digest"]
    path.write_text(json.dumps(doc))
    with pytest.raises(C.ContractError, match="phase 1 has no digest although an earlier one has"):
        C.load(str(path))


def test_a_contract_with_no_phase_is_refused(tmp_path):
    from ckptdoctor import contract as C
    p = tmp_path / C.NAME
    p.write_text(json.dumps({"format": C.FORMAT, "phases": []}))
    with pytest.raises(C.ContractError, match="with at least one phase"):
        C.load(str(p))


def test_a_contract_whose_keys_were_reordered_by_a_json_tool_is_not_called_hand_edited(tmp_path):
    """jq or a JSON formatter may rewrite the file with its keys in another order: the digest is of
    the content, so the contract still loads."""
    from ckptdoctor import contract as C
    c = _contract(tmp_path, total_steps=5)
    doc = json.loads(open(c.path).read())
    doc["phases"] = [dict(reversed(list(p.items()))) for p in doc["phases"]]
    open(c.path, "w").write(json.dumps(doc, indent=2))
    assert C.load(c.path).newest.total_steps == 5


def test_a_code_directory_that_is_gone_is_named_removed(tmp_path):
    import shutil
    from ckptdoctor import contract as C
    code = tmp_path / "code"
    _repo(code)
    c = _contract(tmp_path, code=str(code))
    shutil.rmtree(code)
    assert [(x.kind, x.change, x.now) for x in C.compare(c.newest)] == [("code", "removed", None)]


def test_without_git_installed_code_is_recorded_as_a_tree_of_files(tmp_path, monkeypatch):
    from ckptdoctor import contract as C
    code = tmp_path / "code"
    _repo(code)
    empty = tmp_path / "nobin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    st = C.code_state(str(code))
    assert st["kind"] == "tree" and st["files"] == 1


def test_a_data_file_that_shrinks_while_hashed_is_an_error_not_a_digest(tmp_path, monkeypatch):
    from ckptdoctor import contract as C
    from ckptdoctor.engine.errors import InputError
    f = tmp_path / "d.bin"
    f.write_bytes(b"x" * 10_000)
    real = C.hashing.hash_units

    def shrink_then_hash(st, units, **k):
        os.truncate(f, 4_000)                    # after its size was taken, before its bytes are read
        return real(st, units, **k)
    monkeypatch.setattr(C.hashing, "hash_units", shrink_then_hash)
    with pytest.raises(InputError, match="shrank while being hashed"):
        C.hash_files([str(f)])


def test_a_recipe_diff_shows_at_most_40_lines(tmp_path):
    from ckptdoctor import contract as C
    r = tmp_path / "recipe.yaml"
    r.write_text("".join(f"k{i}: 1\n" for i in range(50)))
    c = _contract(tmp_path, recipe=[r])
    r.write_text("".join(f"k{i}: 2\n" for i in range(50)))
    ch = C.compare(c.newest)
    assert [x.kind for x in ch] == ["recipe"] and len(ch[0].files) == 40
    assert ch[0].files[:2] == ("-k0: 1", "-k1: 1")


def test_only_the_uncommitted_files_that_changed_are_named(tmp_path):
    from ckptdoctor import contract as C
    code = tmp_path / "code"
    _repo(code)
    (code / "keep.py").write_text("k = 1\n")
    (code / "edit.py").write_text("e = 1\n")
    c = C.load(_contract(tmp_path, code=str(code)).path)       # as a later check reads it: from the file
    (code / "edit.py").write_text("e = 2\n")
    ch = C.compare(c.newest)
    assert [x.kind for x in ch] == ["code"] and list(ch[0].files) == ["edit.py (uncommitted)"]


def test_a_phase_whose_index_repeats_an_earlier_one_is_malformed(tmp_path):
    from ckptdoctor import contract as C
    _contract(tmp_path)
    C.new_phase(str(tmp_path / "run"), "again", None, None, None, 7)
    path = tmp_path / "run" / C.NAME
    doc = json.loads(path.read_text())
    ph = {k: v for k, v in doc["phases"][1].items() if k != "digest"}
    ph["index"] = 0
    doc["phases"][1] = {**ph, "digest": C.phase_digest(ph)}
    path.write_text(json.dumps(doc))
    with pytest.raises(C.ContractError, match="phase 1 is malformed"):
        C.load(str(path))


def test_uncommitted_files_beyond_the_limit_are_counted_not_listed(tmp_path, monkeypatch):
    from ckptdoctor import contract as C
    code = tmp_path / "code"
    _repo(code)
    for i in range(5):
        (code / f"n{i}.py").write_text("x\n")
    monkeypatch.setattr(C, "MAX_CODE_FILES", 3)
    st = C.code_state(str(code))
    assert list(st["uncommitted_files"]) == ["n0.py", "n1.py", "n2.py"] and st["uncommitted_count"] == 5


def test_a_contract_that_is_not_json_quotes_at_most_80_characters_of_the_parsers_error(tmp_path, monkeypatch):
    """The parser's own words, cut at 80 characters (its messages differ between Python versions:
    3.13 words a trailing comma differently, so the parser is made to say something long)."""
    from ckptdoctor import contract as C
    p = tmp_path / C.NAME
    p.write_text("{not json")
    said = "the parser's explanation, " * 10

    def parser_says(*a, **k):
        raise ValueError(said)
    monkeypatch.setattr(C.json, "loads", parser_says)
    with pytest.raises(C.ContractError) as ei:
        C.load(str(p))
    assert str(ei.value) == f"{p}: not JSON ({said[:80]})"


def test_a_recipe_that_is_not_utf8_is_checked_by_digest_without_a_diff(tmp_path):
    """A binary or Latin-1 recipe: no text kept, a change still named (no diff, no crash); a text
    recipe that became binary is named the same way."""
    from ckptdoctor import contract as C
    r = tmp_path / "recipe.bin"
    r.write_bytes(b"\xff\xfe lr=1\n")
    c = _contract(tmp_path, recipe=[r])
    assert c.newest.recipe_text == {}
    r.write_bytes(b"\xff\xfe lr=2\n")
    assert [(x.kind, x.change, x.files) for x in C.compare(c.newest)] == [("recipe", "changed", ())]
    t = tmp_path / "recipe.yaml"
    t.write_text("lr: 1\n")
    c = C.new_phase(str(tmp_path / "run"), "text recipe", None, None, [str(t)], None)
    t.write_bytes(b"\xff lr: 2\n")
    assert [(x.kind, x.change, x.files) for x in C.compare(c.newest)] == [("recipe", "changed", ())]


# ---- generated survivors of the contract group's full run (session 23) ----------------------------
def test_the_quick_data_check_rehashes_a_file_that_shrank_or_was_restored_older_with_its_mtime(tmp_path):
    """preflight's quick look skips only a file whose size and mtime are both exactly as recorded:
    a file cut shorter with its mtime put back, and a same-size older copy restored with `cp -p`
    (an older mtime), are re-hashed and named."""
    from ckptdoctor import contract as C
    shrunk, restored = tmp_path / "shrunk.bin", tmp_path / "restored.bin"
    shrunk.write_bytes(b"a" * 1000)
    restored.write_bytes(b"a" * 1000)
    c = _contract(tmp_path, data=[shrunk, restored])
    st = shrunk.stat()
    shrunk.write_bytes(b"a" * 999)
    os.utime(shrunk, ns=(st.st_atime_ns, st.st_mtime_ns))
    st = restored.stat()
    restored.write_bytes(b"b" * 1000)
    os.utime(restored, ns=(st.st_atime_ns, st.st_mtime_ns - 3_600_000_000_000))
    assert _what(C.compare(c.newest, quick_data=True)) == [("data", "restored.bin", "changed"),
                                                           ("data", "shrunk.bin", "changed")]


def test_a_code_directory_that_became_a_repository_is_a_change_not_a_crash(tmp_path):
    from ckptdoctor import contract as C
    code = tmp_path / "code"
    code.mkdir()
    (code / "a.py").write_text("x = 1\n")
    c = _contract(tmp_path, code=str(code))
    assert c.newest.code["kind"] == "tree"
    subprocess.run(["git", "init", "-q", str(code)], check=True)
    subprocess.run([*GIT, "-C", str(code), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(code), "commit", "-qm", "c"], check=True)
    ch = C.compare(C.load(c.path).newest)
    assert _what(ch) == [("code", "code", "changed")] and ch[0].now.startswith("git ")


def test_a_contract_read_back_from_disk_names_the_files_changed_between_commits(tmp_path):
    """What `contract check` does: the recorded phase comes from the JSON file, not from memory."""
    from ckptdoctor import contract as C
    code = tmp_path / "code"
    _repo(code)
    c = _contract(tmp_path, code=str(code))
    (code / "a.py").write_text("x = 2\n")
    subprocess.run([*GIT, "-C", str(code), "commit", "-qam", "edit"], check=True)
    ch = C.compare(C.load(c.path).newest)
    assert [(x.kind, list(x.files)) for x in ch] == [("code", ["a.py"])]


@pytest.mark.parametrize("doc", [{"phases": [{}]}, {"format": "ckptdoctor.contract/v0", "phases": [{}]},
                                 {"format": None, "phases": [{}]}])
def test_a_json_file_of_another_or_no_format_is_refused_in_one_line(tmp_path, doc):
    from ckptdoctor import contract as C
    p = tmp_path / C.NAME
    p.write_text(json.dumps(doc))
    with pytest.raises(C.ContractError, match=r"not a ckptdoctor\.contract/v1 file with at least one phase$"):
        C.load(str(p))


def test_a_contract_of_hundreds_of_phases_loads(tmp_path):
    """A long run relaunched with a change 300 times: phase numbers are compared by value."""
    from ckptdoctor import contract as C
    c = _contract(tmp_path, total_steps=5)
    doc = json.loads(open(c.path).read())
    one = doc["phases"][0]
    doc["phases"] = [dict(one, index=i) for i in range(300)]
    for ph in doc["phases"]:
        ph.pop("digest", None)                   # an earlier version's unsigned phases
    open(c.path, "w").write(json.dumps(doc))
    assert len(C.load(c.path).phases) == 300


def test_a_recipe_file_after_an_unreadable_one_keeps_its_text_for_the_diff(tmp_path):
    from ckptdoctor import contract as C
    binary, text = tmp_path / "a.bin", tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe\n")
    text.write_text("lr: 1\n")
    c = _contract(tmp_path, recipe=[binary, text])
    assert list(c.newest.recipe_text) == [str(text)]
    text.write_text("lr: 2\n")
    assert [(x.item, x.files) for x in C.compare(c.newest)] == [(str(text), ("-lr: 1", "+lr: 2"))]


def test_a_data_path_turned_into_a_fifo_is_named_removed_and_the_other_paths_still_compared(tmp_path):
    from ckptdoctor import contract as C
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    c = _contract(tmp_path, data=[a, b])
    a.unlink()
    os.mkfifo(a)
    assert _what(C.compare(c.newest)) == [("data", "a.bin", "removed")]
    b.write_bytes(b"c")
    assert _what(C.compare(c.newest)) == [("data", "a.bin", "removed"), ("data", "b.bin", "changed")]


def test_a_code_directory_outside_git_sees_an_edit_that_keeps_the_file_count(tmp_path, monkeypatch):
    from ckptdoctor import contract as C
    code = tmp_path / "code"
    code.mkdir()
    (code / "a.py").write_text("x = 1\n")
    c = _contract(tmp_path, code=str(code))
    assert c.newest.code["kind"] == "tree"
    (code / "a.py").write_text("x = 2\n")
    assert _what(C.compare(c.newest)) == [("code", "code", "changed")]


def test_a_recipe_change_message_shows_four_diff_lines_and_counts_the_rest(run):
    recipe = run.parent / "recipe.yaml"
    for new, tail in (("lr: 0.002\na: 1\nb: 2\n", ": -lr: 0.001; +lr: 0.002; +a: 1; +b: 2"),
                      ("lr: 0.002\na: 1\nb: 2\nc: 3\nd: 4\n", ": -lr: 0.001; +lr: 0.002; +a: 1; +b: 2 (+2 more lines)")):
        recipe.write_text(new)
        rc, doc, err = check(run)
        (f,) = assert_fires_json(doc, "CKD513")
        assert f["message"].endswith(tail), f["message"]


@pytest.mark.parametrize("n", [4, 5, 6])
def test_a_code_change_message_names_five_files_and_marks_more_with_dots(run, n):
    """Up to five differing files are all named and nothing follows them; a sixth is marked " ..."."""
    code = run.parent / "code"
    for i in range(n):
        (code / f"m{i}.py").write_text(f"v = {i}\n")
    subprocess.run([*GIT, "-C", str(code), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(code), "commit", "-qm", "more"], check=True)
    rc, doc, err = check(run)
    (f,) = assert_fires_json(doc, "CKD511")
    named = ", ".join(f"m{i}.py" for i in range(min(n, 5)))
    assert f["message"].endswith(f": {n} file(s) differ: {named}" + (" ..." if n > 5 else "")), f["message"]


@pytest.mark.parametrize("new_lines", [2, 4, 8])
def test_a_recipe_edit_shows_its_first_four_diff_lines_and_counts_the_rest(run, new_lines):
    """A recipe change is shown as the diff itself: its first four lines, then "(+N more lines)" with
    N exactly the lines not shown; a short diff is shown whole.  The finding sits on the recipe; a
    changed total_steps has no file of its own and sits on the contract."""
    (run.parent / "recipe.yaml").write_text("".join(f"k{i}: {i}\n" for i in range(new_lines)))
    rc, doc, _ = check(run, "--total-steps", "1200")
    f = next(f for f in doc["findings"] if f["rule"] == "CKD513")
    diff = f["details"]["diff"]
    assert rc == 1 and f["path"].endswith("recipe.yaml") and len(diff) == new_lines + 1, diff
    shown = "; ".join(diff[:4])
    assert f["message"].endswith(f": {shown} (+{len(diff) - 4} more lines)" if len(diff) > 4 else f": {shown}"), f["message"]
    t = next(f for f in doc["findings"] if f["rule"] == "CKD514")
    assert t["path"].endswith("ckptdoctor.contract.json") and t["details"]["item"] == "total_steps", t


def test_a_removed_or_added_data_file_is_said_so_without_a_was_now_of_one_side(run):
    """A data file gone or new since the contract: the sentence says which, and stops there (no
    "was <hash>, now None")."""
    os.remove(run.parent / "data" / "shard-1.bin")
    (run.parent / "data" / "shard-2.bin").write_bytes(b"new")
    rc, doc, _ = check(run)
    said = {os.path.basename(f["details"]["item"]): f["message"] for f in doc["findings"]}
    for name, what in (("shard-1.bin", "was removed"), ("shard-2.bin", "was added")):
        assert said[name].endswith(f"shard-{name[6]}.bin {what} since contract phase 0 (initial)"), said[name]
