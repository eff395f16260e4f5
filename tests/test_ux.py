"""What a new user trips over (issue 21): the relaunch gate, output that survives Slurm logs, JSON
Schemas that real outputs validate against, SARIF a code-scanning UI can use, refusals where a
write would hurt, install hints that name the right extra."""
import json
import os

import pytest

from ckptdoctor import api
from ckptdoctor.layouts import dcp_writer as W
from helpers import assert_fires, cli

TRACKER = "latest_checkpointed_iteration.txt"


def iter_dir(d, step=100, world=2):
    W.write(str(d), [W.Item("w", (2 * world, 4), (2 * r, 0), (2, 4), [float(step + r)] * 8, rank=r)
                     for r in range(world)])
    (d / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    return d


@pytest.fixture
def run_with_old_breakage(tmp_path):
    """iter 100 broken (a truncated shard), iter 200 healthy and named by the tracker."""
    root = tmp_path / "run"
    for s in (100, 200):
        iter_dir(root / f"iter_{s:07d}", s)
    os.truncate(root / "iter_0000100" / "__1_0.distcp", 100)
    (root / TRACKER).write_text("200")
    return root


# ---- the relaunch gate ----------------------------------------------------------------------------
def test_relaunch_gate_judges_only_what_resumes(run_with_old_breakage):
    root = run_with_old_breakage
    rc, out, _ = cli("verify", "-f", "json", str(root))
    assert rc == 1  # judging everything: the old broken checkpoint fails
    rc, out, _ = cli("verify", "--target", "resume", "-f", "json", str(root))
    doc = json.loads(out)
    assert rc == 0 and not [f for f in doc["findings"] if f["rule"] == "CKD104"]
    assert doc["facts"]["resume_from"] == "iter_0000200" and doc["facts"]["target"] == "resume"
    assert doc["facts"]["not_judged"] == ["iter_0000100"]      # older than a complete target: not opened
    assert [r["name"] for r in doc["facts"]["checkpoints"]] == ["iter_0000200"]
    text = cli("verify", "--target", "resume", str(root))[1]
    assert "not judged by the gate: iter_0000100" in text


def test_a_broken_resume_target_has_the_older_checkpoints_judged_for_a_fallback(run_with_old_breakage):
    root = run_with_old_breakage
    iter_dir(root / "iter_0000050", 50)
    os.truncate(root / "iter_0000200" / "__0_0.distcp", 10)
    doc = json.loads(cli("verify", "--target", "resume", "-f", "json", str(root))[1])
    assert doc["facts"]["gate"]["passed"] is False
    old = [f for f in doc["findings"] if f["rule"] == "CKD104" and "iter_0000100" in f["path"]]
    assert old and old[0]["severity"] == "info" and old[0]["details"]["gated_from"] == "error"
    dangling = [f for f in doc["findings"] if f["rule"] == "CKD113"]
    assert dangling and dangling[0]["details"]["newest_complete"] == "iter_0000050"
    assert doc["facts"]["newest_complete"] == "iter_0000050" and "not_judged" not in doc["facts"]


def test_relaunch_gate_fails_when_the_resume_target_is_broken(run_with_old_breakage):
    root = run_with_old_breakage
    (root / TRACKER).write_text("100")
    rep = api.verify(str(root), target="resume")
    assert_fires(rep, "CKD104", severity="error")
    assert_fires(rep, "CKD113", severity="error")
    assert rep.failed()


def test_relaunch_gate_fails_when_nothing_resumes(run_with_old_breakage):
    root = run_with_old_breakage
    (root / TRACKER).write_text("300")  # dangling: the framework fails (or starts over)
    rep = api.verify(str(root), target="resume")
    assert rep.facts["resume_from"] is None
    assert_fires(rep, "CKD113", severity="error")
    assert rep.failed()


# ---- JSON that tools can use ------------------------------------------------------------------------
def test_reports_validate_against_the_shipped_schema(run_with_old_breakage, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    rc, out, _ = cli("schema", "report")
    schema = json.loads(out)
    reports = [cli("verify", "-f", "json", str(run_with_old_breakage))[1],
               cli("verify", "--checksums", "-f", "json", str(run_with_old_breakage))[1],
               cli("preflight", "-f", "json", str(run_with_old_breakage), "--nodelist", "n[1-2]",
                   "--ranks-per-node", "1")[1],
               cli("publish", "-q", "-f", "json", str(run_with_old_breakage / "iter_0000200"),
                   str(tmp_path / "dest"))[1]]
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"schema": "ckptdoctor.run_state/v1", "sampler": {"cursor": 6},
                                 "trainer": {"version": 7}, "config": {"num_prompts_per_step": 4,
                                                                       "max_lookahead_versions": 1}}))
    reports.append(cli("reconcile", "-f", "json", str(state))[1])
    for text in reports:
        doc = json.loads(text)
        jsonschema.validate(doc, schema)
        assert os.path.isabs(doc["root"])
    bad = json.loads(reports[0])
    bad["findings"][0]["severity"] = "fatal"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_read_plan_schema_accepts_what_preflight_reads_and_refuses_what_it_refuses(tmp_path):
    """`ckptdoctor schema read-plan` describes the record preflight --read-plan takes: the plan a
    save records validates; a rank list preflight refuses is refused by the schema too, and preflight
    says so in one line (exit 2), never a traceback."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(cli("schema", "read-plan")[1])
    from ckptdoctor.preflight.readsets import read_plan_record
    good = read_plan_record(2, [["w", "rank0.x"], ["w", "rank1.x"]])
    jsonschema.validate(good, schema)
    assert good["keys"] == {"rank0.x": [0], "rank1.x": [1], "w": "all"}
    bad = dict(good, keys={"w": []})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    (tmp_path / "plan.json").write_text(json.dumps(bad))
    rc, out, err = cli("preflight", str(tmp_path), "--nodelist", "n1", "--ranks-per-node", "1",
                       "--read-plan", str(tmp_path / "plan.json"))
    assert rc == 2 and "Traceback" not in err and "--read-plan" in err and len(err.strip().splitlines()) == 1, err


def test_run_state_schema_matches_what_reconcile_reads(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(cli("schema", "run-state")[1])
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fixtures"))
    pytest.importorskip("torch")
    import nemo_rl_ckpt
    step = nemo_rl_ckpt.write_step(tmp_path / "rl", step=7)
    rc, out, err = cli("reconcile", "--show-state", step)
    state = json.loads(out)
    jsonschema.validate(state, schema)  # what --show-state prints is a valid run_state/v1 ...
    p = tmp_path / "state.json"
    p.write_text(out)
    assert cli("reconcile", str(p))[0] in (0, 1)  # ... and reconcile reads it back
    state["trainer"]["steps"] = 3
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(state, schema)
    del state["trainer"]["steps"]
    state["config"]["num_prompts_per_step"] = 0     # a count: reconcile refuses 0, so does the schema
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(state, schema)


# ---- output that survives where it is read ------------------------------------------------------------
def test_text_off_a_terminal_never_truncates(tmp_path):
    from helpers import spread
    src = iter_dir(tmp_path / "src" / "iter_0000100")
    long = tmp_path / ("a-rather-long-directory-name-that-would-not-fit-in-eighty-columns" * 2) / "nodes"
    loc = spread(src, long, ["node-with-a-long-name-0001", "node-with-a-long-name-0002"], 1)
    rc, out, err = cli("preflight", loc, "--nodelist", "node-with-a-long-name-[0001-0002]", "--ranks-per-node", "1")
    assert rc == 0, err
    assert "…" not in out
    assert str(long / "node-with-a-long-name-0002" / "run7") in out
    assert "2 nodes, 2 ranks" in out and "(s)" not in out


def test_durations_and_tracker_changes_read_like_prose(tmp_path):
    from ckptdoctor.report.text import duration
    assert [duration(s) for s in (5, 65, 3600, 36070043.1)] == ["5 s", "1 min 5 s", "1 h", "417 d 11 h"]
    src = iter_dir(tmp_path / "src" / "iter_0000100")
    rc, out, err = cli("publish", "-q", str(src), str(tmp_path / "dest"))
    out = " ".join(out.split())  # prose is wrapped at the log's width: read it as one text
    assert rc == 0 and f"{TRACKER}: now 100" in out and "None" not in out and "'" not in out.split("tracker")[1]


# ---- refusals where a write would hurt ------------------------------------------------------------------
def test_publish_refuses_a_destination_inside_the_source(tmp_path):
    src = iter_dir(tmp_path / "iter_0000100")
    for dest in (src, src / "out"):
        rc, out, err = cli("publish", "-q", str(src), str(dest))
        assert rc == 2 and "inside (or is) the source" in err, err
    assert sorted(os.listdir(src)) == sorted(["__0_0.distcp", "__1_0.distcp", ".metadata", "metadata.json"])


def test_manifest_refuses_a_broken_checkpoint_and_replaces_atomically(tmp_path):
    d = iter_dir(tmp_path / "iter_0000100")
    os.truncate(d / "__1_0.distcp", 10)
    rc, out, err = cli("manifest", "-q", str(d))
    assert rc == 2 and "fails verification" in err and "CKD104" in err and not (d / "ckptdoctor.manifest.json").exists()
    rc, out, err = cli("manifest", "-q", "--force", str(d))
    assert rc == 0, err
    first = (d / "ckptdoctor.manifest.json").read_bytes()
    rc, out, err = cli("manifest", "-q", "--force", str(d))
    assert rc == 2 and "already exists" in err and "--replace" in err
    (d / "__1_0.distcp").write_bytes(b"y" * 10)
    rc, out, err = cli("manifest", "-q", "--force", "--replace", str(d))
    assert rc == 0 and (d / "ckptdoctor.manifest.json").read_bytes() != first
    assert not [e for e in os.listdir(d) if "tmp" in e]


def test_demo_refuses_a_non_empty_directory_and_reruns_cleanly(tmp_path):
    (tmp_path / "mine.txt").write_text("precious")
    rc, out, err = cli("demo", str(tmp_path))
    assert rc == 2 and "not empty" in err and (tmp_path / "mine.txt").read_text() == "precious"
    d = tmp_path / "demo"
    assert cli("demo", str(d))[0] == 0
    assert cli("demo", str(d))[0] == 0  # its own earlier demo is replaced, not an error


# ---- install hints name their own extra --------------------------------------------------------------------
@pytest.mark.parametrize("url, extra, pkg", [("gs://bucket/run", "gcs", "gcsfs"), ("sftp://host/run", "sftp", "paramiko"),
                                             ("s3://bucket/run", "s3", "s3fs")])
def test_install_hints(url, extra, pkg):
    from ckptdoctor.io.fs import install_hint
    assert install_hint(url) == f"install it: pip install 'ckptdoctor[{extra}]' (brings {pkg})"
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    from pathlib import Path
    extras = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert pkg in extras[extra]


# ---- consistent options, completion ----------------------------------------------------------------------
def test_every_subcommand_takes_format_quiet_and_debug():
    import typer
    from ckptdoctor.cli import app
    cmd = typer.main.get_command(app.build())
    leaves = []
    for name, sub in cmd.commands.items():  # groups (contract, digests): each subcommand
        leaves += [(f"{name} {n}", c) for n, c in sub.commands.items()] if hasattr(sub, "commands") else [(name, sub)]
    for name, sub in leaves:
        opts = {o for p in sub.params for o in getattr(p, "opts", [])}
        assert {"-f", "--format", "-q", "--quiet", "--debug"} <= opts, (name, sorted(opts))
        if name in ("verify", "publish", "reconcile", "preflight"):
            assert {"-v", "--verbose", "--color"} <= opts, name


def test_verbose_names_the_config_and_color_is_controllable(run_with_old_breakage, tmp_path):
    cfg = tmp_path / "ckptdoctor.toml"
    cfg.write_text("[verify]\nmtime-tolerance = 5\n")
    rc, out, err = cli("verify", "-v", "--config", str(cfg), str(run_with_old_breakage))
    assert f"config: {cfg}" in err and "verify took" in err
    rc, out, _ = cli("verify", "--color", "always", str(run_with_old_breakage))
    assert "\x1b[" in out
    rc, out, _ = cli("verify", "--color", "never", str(run_with_old_breakage))
    assert "\x1b[" not in out


@pytest.mark.parametrize("words, cword, want", [
    ("ckptdoctor rules CKD10", 2, {"CKD101", "CKD104"}),
    ("ckptdoctor verify --layout megatron", 3, {"megatron", "megatron-torch-dist", "megatron-legacy"}),
    ("ckptdoctor verify --select tracker-", 3, {"tracker-missing", "tracker-dangling"}),
])
def test_completion_of_rule_ids_and_layout_names(words, cword, want):
    rc, out, _ = cli(env={"_CKPTDOCTOR_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)})
    assert want <= set(out.split()), out


def test_manifest_json_output_is_a_report_like_every_other(tmp_path):
    """A generic consumer reads `command`, `findings`, `summary` and `facts` from every JSON output."""
    jsonschema = pytest.importorskip("jsonschema")
    d = iter_dir(tmp_path / "iter_0000100")
    rc, out, err = cli("manifest", "-q", "-f", "json", str(d))
    doc = json.loads(out)
    jsonschema.validate(doc, json.loads(cli("schema", "report")[1]))
    assert rc == 0 and doc["command"] == "manifest" and doc["findings"] == []
    assert doc["facts"]["manifest"] == str(d / "ckptdoctor.manifest.json") and doc["facts"]["files"] == 4


# ---- issue 41: one line per finding for logs and CI ---------------------------------------------
def _broken_run(tmp_path):
    rc, out, err = cli("demo", str(tmp_path / "demo"))
    return tmp_path / "demo" / "megatron-run"


def test_concise_prints_one_line_per_finding_and_the_verdict(tmp_path):
    import re
    run = _broken_run(tmp_path)  # the demo repaired it at the end: break it again
    (run / "iter_0000300" / "__0_0.distcp").unlink()
    rc, out, err = cli("verify", "--format", "concise", str(run))
    lines = out.splitlines()
    assert rc == 1 and lines and "Traceback" not in err
    for line in lines[:-1]:
        assert re.fullmatch(r"[^\n]+:CKD\d{3}:(error|warning|info): \S.*", line), line
    assert any(":CKD" in x and "__0_0.distcp" in x for x in lines[:-1])
    assert re.fullmatch(r"verify: FAIL - \d+ errors?, \d+ warnings?, \d+ info; resumes from iter_\d+; checked \d+ "
                        r"files, [0-9.]+ KiB \(listing, sizes, markers\)", lines[-1]), lines[-1]


def test_github_annotations_follow_the_workflow_command_syntax(tmp_path):
    import re
    run = _broken_run(tmp_path)
    (run / "iter_0000300" / "__0_0.distcp").unlink()
    rc, out, err = cli("verify", "--format", "github", str(run))
    anns = [x for x in out.splitlines() if x.startswith("::")]
    assert rc == 1 and anns
    for a in anns:  # properties escape % \r \n : , ; the message escapes % \r \n
        m = re.fullmatch(r"::(error|warning|notice) file=([^,:\n]*),title=([^,:\n]*)::([^\r\n]*)", a)
        assert m, a
        assert "%0A" not in m.group(2)
    assert any(a.startswith("::error ") and "%0Ahint: " in a for a in anns)


def test_gitlab_code_quality_report_is_valid(tmp_path):
    """GitLab's code quality artifact: an array of issues with the fields GitLab requires.  GitLab
    publishes no schema file: the schema below is its documented field table
    (https://docs.gitlab.com/ci/testing/code_quality/#code-quality-report-format), including the
    severity values and a location path relative to the project directory, without ./."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "array", "items": {
        "type": "object", "required": ["description", "check_name", "fingerprint", "severity", "location"],
        "properties": {"description": {"type": "string"}, "check_name": {"type": "string"},
                       "fingerprint": {"type": "string", "minLength": 1},
                       "severity": {"enum": ["info", "minor", "major", "critical", "blocker"]},
                       "location": {"type": "object", "required": ["path", "lines"],
                                    "properties": {"path": {"type": "string"},
                                                   "lines": {"type": "object", "required": ["begin"],
                                                             "properties": {"begin": {"type": "integer"}}}}}}}}
    run = _broken_run(tmp_path)
    (run / "iter_0000300" / "__0_0.distcp").unlink()
    rc, out, err = cli("verify", "--format", "gitlab", str(run))
    doc = json.loads(out)
    jsonschema.validate(doc, schema)
    assert rc == 1 and doc and len({d["fingerprint"] for d in doc}) == len(doc)
    assert any(d["severity"] == "major" and d["check_name"].startswith("CKD1") for d in doc)
    rc, out, err = cli("verify", "--format", "gitlab", run.name, cwd=str(run.parent))   # the CI job's project dir
    paths = [d["location"]["path"] for d in json.loads(out)]
    assert paths and all(p.startswith(run.name + "/") or p == run.name for p in paths), paths
    rc, out, err = cli("rules", "--format", "gitlab")
    assert rc == 2 and "text or json" in err


def test_output_file_exit_zero_and_statistics(tmp_path):
    """-o FILE gets exactly the report stdout would get (written atomically, no temp left beside it);
    --exit-zero turns a failing verdict into exit 0 but never a usage error; --statistics counts
    findings per rule on stderr and leaves the report's format alone."""
    run = _broken_run(tmp_path)
    (run / "iter_0000300" / "__0_0.distcp").unlink()
    rc, out, err = cli("verify", "-f", "concise", str(run))
    assert rc == 1
    rc2, out2, err2 = cli("verify", "-f", "concise", "-o", str(tmp_path / "rep.json"), str(run))
    assert rc2 == 1 and out2 == "" and (tmp_path / "rep.json").read_text() == out
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("rep")) == ["rep.json"]
    rc, out3, err3 = cli("verify", "--exit-zero", "-f", "json", str(run))
    assert rc == 0 and json.loads(out3)["summary"]["error"] > 0
    rc, o, e = cli("verify", "--exit-zero", "--select", "NOPE999", str(run))
    assert rc == 2
    rc, out4, err4 = cli("verify", "--statistics", "-f", "json", str(run))
    doc = json.loads(out4)
    n = sum(1 for f in doc["findings"] if f["rule"] == doc["findings"][0]["rule"])
    assert rc == 1 and f"{n:>6}  {doc['findings'][0]['rule']}" in err4 and "findings in all" in err4
    rc, o, e = cli("verify", "-o", str(tmp_path / "no" / "such" / "dir" / "r.json"), str(run))
    assert rc == 2 and "--output" in e and "Traceback" not in e


def test_verify_several_paths_one_document_and_the_worst_exit(tmp_path):
    """`verify A B`: one process, one document (json: a `reports` list valid against the shipped
    schema; text: each report, then one line), one exit status: the worst."""
    jsonschema = pytest.importorskip("jsonschema")
    a = _broken_run(tmp_path).parent / "durable-run"   # what the demo published: healthy
    from ckptdoctor.demo import build_run
    build_run(str(tmp_path / "b"))                 # the demo's broken run root
    rc, out, err = cli("verify", "--target", "resume", "-f", "json", str(a), str(tmp_path / "b"))
    doc = json.loads(out)
    jsonschema.validate(doc, json.loads(cli("schema", "report")[1]))
    assert rc == 1 and [r["target"] for r in doc["reports"]] == [str(a), str(tmp_path / "b")]
    assert doc["failed"] == [str(tmp_path / "b")] and doc["summary"]["error"] == sum(
        r["summary"]["error"] for r in doc["reports"])
    rc, out, err = cli("verify", "--target", "resume", str(a), str(a))
    assert rc == 0 and out.rstrip().endswith("verify: 2 paths, all ok")
    rc, out, err = cli("verify", "--target", "resume", "-f", "sarif", str(a), str(tmp_path / "b"))
    assert rc == 1 and len(json.loads(out)["runs"]) == 2


def test_a_passing_verify_says_what_it_checked_in_every_format(tmp_path):
    """`ok` alone is nothing to quote: the summary names the layout, files and bytes checked and what
    was compared, in text, in the one-line formats and in JSON facts."""
    ck = _broken_run(tmp_path).parent / "durable-run" / "iter_0000200"
    files = [p for p in ck.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    rc, out, err = cli("verify", "--checksums", "-f", "json", str(ck))
    chk = json.loads(out)["facts"]["checked"]
    assert rc == 0 and (chk["checkpoints"], chk["files"], chk["bytes"]) == (1, len(files), size)
    assert chk["compared"] == ["listing", "sizes", "markers", "checksums"]
    rc, out, err = cli("verify", str(ck))
    assert rc == 0 and f"checked 1 checkpoint (megatron-torch-dist): {len(files)} files" in out
    rc, out, err = cli("verify", "--deep", "-f", "concise", str(ck))
    assert rc == 0 and out.strip().endswith("(listing, sizes, markers, deep scan)"), out
    rc, out, err = cli("verify", "-f", "sarif", str(ck))
    inv = json.loads(out)["runs"][0]["invocations"][0]
    assert rc == 0 and inv["properties"]["verdict"] == "ok" and inv["properties"]["checked"]["files"] == len(files)
    note = inv["toolExecutionNotifications"][0]["message"]["text"]
    assert note.startswith("verify: ok; checked 1 checkpoint(s)") and f"{size} bytes" in note, note


def test_acknowledged_findings_are_info_with_their_reason_and_never_change_the_gate(tmp_path):
    from ckptdoctor.demo import build_run
    from helpers import assert_fires_json
    run = tmp_path / "run"
    build_run(str(run))
    cfg = tmp_path / "ckptdoctor.toml"
    cfg.write_text('[[acknowledge]]\ncheckpoint = "iter_0000300"\nrule = "CKD104"\n'
                   'reason = "kept for forensics, never resumed"\nuntil = 2999-12-31\n')
    rc, out, err = cli("verify", "--config", str(cfg), "-f", "json", str(run))
    doc = json.loads(out)
    (f,) = [x for x in doc["findings"] if x["rule"] == "CKD104"]
    assert f["severity"] == "info" and f["details"]["acknowledged"]["reason"] == "kept for forensics, never resumed"
    assert f["hint"].startswith("acknowledged (kept for forensics")
    assert not [x for x in doc["findings"] if x["rule"] == "CKD903"]   # a current acknowledgement is silent
    row = next(r for r in doc["facts"]["checkpoints"] if r["name"] == "iter_0000300")
    assert row["complete"] is False                      # completeness is judged as ever
    rc, out, err = cli("verify", "--config", str(cfg), "--target", "resume", str(run))
    assert rc == 1                                       # and so is the relaunch gate
    cfg.write_text('[[acknowledge]]\ncheckpoint = "iter_0000300"\nrule = "CKD104"\nreason = "old"\nuntil = 2000-01-01\n')
    rc, out, err = cli("verify", "--config", str(cfg), "-f", "json", str(run))
    doc = json.loads(out)
    assert [x["severity"] for x in doc["findings"] if x["rule"] == "CKD104"] == ["error"]
    (hit,) = assert_fires_json(doc, "CKD903")
    assert hit["severity"] == "warning" and "expired on 2000-01-01" in hit["message"]
    cfg.write_text('[[acknowledge]]\ncheckpoint = "iter_0000300"\nrule = "104"\nreason = "x"\n')
    rc, out, err = cli("verify", "--config", str(cfg), str(run))
    assert rc == 2 and "CKDnnn" in err and "Traceback" not in err
