"""`ckptdoctor forensics`: the first checkpoint-related failure of a failed job, proven on real logs.

The corpus (tests/fixtures/real/forensics/) was written by tests/conformance/gen_forensics.py running the
real libraries (torch 2.13 DCP over gloo with 2-4 ranks under torchrun or as separate tasks, torch.load,
DeepSpeed 0.19.8, the transformers Trainer) on damaged checkpoints, a full tmpfs and an address-space
limit; each case's truth is what the generator did."""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil

import pytest

from ckptdoctor import api
from helpers import FIRED, assert_fires, cli

BASE = os.path.join(os.path.dirname(__file__), "fixtures", "real", "forensics")
DOC = json.load(open(os.path.join(BASE, "cases.json")))
CASES = sorted(DOC["cases"])


def _logs(name: str) -> list[str]:
    return [os.path.join(BASE, name, n) for n in DOC["cases"][name]["logs"]]


def _rel(case: dict, path: str | None) -> str | None:
    return path.replace(case["base"] + "/", "") if path else None


def test_the_corpus_covers_every_failure_the_issue_names():
    kinds = {c["mode"] for c in DOC["cases"].values()}
    assert DOC["cases"]["dcp-shard-missing"]["nproc"] == 4
    classes = {c["truth"]["class"] for c in DOC["cases"].values()}
    assert {"dcp-load", "dcp-load-killed", "dcp-save-big", "torch-load", "torch-load-as-limit", "ds-load",
            "trainer-resume"} <= kinds
    assert {"file", "memory", "derived-state"} <= classes
    assert any(c["truth"]["after"] for c in DOC["cases"].values()), "no case where a rank only failed after"
    assert DOC["torch"] and all("library" in c for c in DOC["cases"].values() if c["mode"] in ("ds-load",
                                                                                                 "trainer-resume"))


@pytest.mark.parametrize("name", CASES)
def test_forensics_names_the_true_first_cause_rank_file_and_class(name):
    case = DOC["cases"][name]
    truth = case["truth"]
    rep = api.forensics(_logs(name))
    first = rep.facts["first_failure"]
    assert first is not None, f"{name}: no failure found"
    hit = assert_fires(rep, "CKD601", severity="warning")[0]
    assert rep.facts["class"] == truth["class"], (name, first)
    assert first["ranks"] == truth["ranks"], (name, first)
    if truth["exception"]:
        assert first["exception"] == truth["exception"], (name, first)
    assert first["errno"] == truth["errno"], (name, first)
    if truth["file"]:
        assert _rel(case, first["path"]) == truth["file"], (name, first["path"])
        assert os.path.basename(truth["file"]) in hit.message
    else:
        assert first["path"] is None
    assert rep.facts["timed_out_ranks"] == truth["after"]
    assert not set(truth["after"]) & set(first["ranks"]), "a rank that only failed after was blamed"
    assert any(f.rule == "CKD602" for f in rep.findings) == bool(truth["after"]), "CKD602 without such a rank"
    assert not rep.failed(), "a cause found and explained exits 0"
    # the message opens with who failed, then when, to the millisecond the log gave
    rs = truth["ranks"]
    who = "the process" if not rs else f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))
    who += f" on {first['host']}" if first.get("host") else ""
    when = f" at {first['time'][:23]}" if first.get("time") else ""
    assert hit.message.startswith(f"{who} failed first{when}: "), (who, when, hit.message)
    # the error's own words, at most 160 characters of them; the class, and a guess said to be one
    if first.get("message") and first["message"] != first["exception"]:
        assert f" ({first['message'][:160]})" in hit.message, hit.message
        assert first["message"][:161] not in hit.message or len(first["message"]) <= 160, hit.message
    likely = "" if first["certain"] else " (likely: nothing in the log says more)"
    assert hit.message.endswith(f"[{first['class']}: {first['what']}{likely}]"), hit.message


@pytest.mark.parametrize("name", [n for n in CASES if DOC["cases"][n]["truth"]["after"]])
def test_a_rank_that_only_failed_after_is_reported_as_such_and_never_blamed(name):
    rep = api.forensics(_logs(name))
    hit = assert_fires(rep, "CKD602", severity="info")[0]
    assert hit.details["ranks"] == DOC["cases"][name]["truth"]["after"]


@pytest.mark.parametrize("name", [n for n in CASES if os.path.isdir(os.path.join(BASE, n, "run"))
                                  and DOC["cases"][n]["truth"]["file"] and DOC["cases"][n]["truth"].get("broken", True)])
def test_with_the_run_root_the_broken_checkpoint_is_verified_and_linked(tmp_path, name):
    """The log's paths are another machine's (/tmp/ckd-forensics/...): the run root is a copy."""
    case = DOC["cases"][name]
    truth = case["truth"]
    root = shutil.copytree(os.path.join(BASE, name, "run"), tmp_path / "copy" / "run", symlinks=True)
    rc, out, err = cli("forensics", *_logs(name), "--run-root", str(root), "--format", "json")
    doc = json.loads(out)
    ck = doc["facts"]["checkpoint"]
    want = truth.get("finding_file") or truth["file"]
    want_dir = want if os.path.isdir(os.path.join(BASE, name, want)) else os.path.dirname(want)
    assert ck["path"] == os.path.join(str(tmp_path / "copy"), want_dir), ck
    assert ck["broken"] and rc == 1, (rc, ck, err)
    assert ck["linked"] and any(os.path.basename(want) in (x["path"] + x["message"]) for x in ck["linked"]), ck
    assert not [f for f in doc["findings"] if f["rule"] == "CKD604"], "linked, yet said not to be found"
    assert f"checkpoint {ck['path']}" in cli("forensics", *_logs(name), "--run-root", str(root))[1]


@pytest.mark.parametrize("name", [n for n in CASES if DOC["cases"][n]["truth"].get("broken") is False])
def test_derived_state_with_a_complete_checkpoint_exits_0_and_says_the_files_are_fine(tmp_path, name):
    """The files loaded; the state after the restore was wrong (a trainer that never restored its step,
    caught by ckptdoctor.resume.check in the real run): not a broken checkpoint."""
    root = shutil.copytree(os.path.join(BASE, name, "run"), tmp_path / "run", symlinks=True)
    rc, out, err = cli("forensics", *_logs(name), "--run-root", str(root), "--format", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["facts"]["class"] == "derived-state" and doc["facts"]["checkpoint"]["broken"] is False
    assert not [f for f in doc["findings"] if f["severity"] == "error"]
    assert "verify finds it complete" in cli("forensics", *_logs(name), "--run-root", str(root))[1]


def test_a_run_root_where_the_blamed_path_is_nowhere_is_said(tmp_path):
    rep = api.forensics(_logs("dcp-shard-missing"), run_root=str(tmp_path))
    hit = assert_fires(rep, "CKD604", severity="warning")[0]
    assert "__2_0.distcp" in hit.message
    assert "checkpoint" not in rep.facts


def test_srun_l_prefixes_and_interleaving_give_the_same_answer(tmp_path):
    """The per-rank files of the torchrun --log-dir case, interleaved line by line under `srun -l`
    task prefixes (as one Slurm output file holds them)."""
    name = "dcp-shard-missing-logdir"
    per = [open(p).read().splitlines() for p in _logs(name)]
    lines = []
    for i in range(max(map(len, per))):
        for r, ls in enumerate(per):
            if i < len(ls):
                lines.append(f"{r}: {ls[i]}")
    (tmp_path / "slurm-42.out").write_text("\n".join(lines) + "\n")
    a = api.forensics(_logs(name)).facts["first_failure"]
    b = api.forensics([str(tmp_path / "slurm-42.out")]).facts["first_failure"]
    assert (b["exception"], b["path"], b["ranks"]) == (a["exception"], a["path"], a["ranks"]) == \
        ("FileNotFoundError", a["path"], [0, 1, 2, 3])
    assert a["path"].endswith("__1_0.distcp")


def test_an_oom_kill_in_the_kernel_log_is_memory_and_names_the_rank_by_pid(tmp_path):
    name = "dcp-rank-killed"
    text = open(_logs(name)[0]).read()
    pid = re.search(r"exitcode\s*:\s*-9 \(pid: (\d+)\)", text).group(1)
    (tmp_path / "dmesg.txt").write_text(f"[12345.678] Out of memory: Killed process {pid} (python) total-vm:9GB\n")
    rep = api.forensics(_logs(name) + [str(tmp_path / "dmesg.txt")])
    first = rep.facts["first_failure"]
    assert (rep.facts["class"], first["ranks"]) == ("memory", [1])
    assert first["signature"] == "oom-kill" and first["certain"]
    assert not api.forensics(_logs(name)).facts["first_failure"]["certain"], "a bare SIGKILL is only likely memory"


def test_collective_timeouts_alone_are_never_called_the_cause(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("2026-12-03 12:00:00 rank0 INFO loading checkpoint from /ckpt/step-9\n"
                   "[rank0]: Traceback (most recent call last):\n"
                   "[rank0]:   File \"train.py\", line 3, in <module>\n"
                   "[rank0]: torch.distributed.DistBackendError: [Rank 0] Watchdog caught collective operation "
                   "timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.\n"
                   "2026-12-03 12:10:01 rank1 INFO loading checkpoint from /ckpt/step-9\n"
                   "[rank1]: Traceback (most recent call last):\n"
                   "[rank1]:   File \"torch/serialization.py\", line 3, in load\n"
                   "[rank1]: RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central "
                   "directory\n")
    rep = api.forensics([str(log)])
    first = rep.facts["first_failure"]
    assert (first["ranks"], first["signature"], first["path"]) == ([1], "torch-zip", "/ckpt/step-9")
    assert rep.facts["timed_out_ranks"] == [0]


def test_a_log_without_a_checkpoint_failure_says_so_and_exits_0(tmp_path):
    log = tmp_path / "ok.log"
    log.write_text("step 1 loss 2.3\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "ValueError: bad learning rate\n")
    rc, out, err = cli("forensics", str(log), "--format", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["facts"]["first_failure"] is None and doc["facts"]["class"] is None, (rc, err)
    [f] = [f for f in doc["findings"] if f["rule"] == "CKD603"]
    FIRED.add("CKD603")
    assert f["severity"] == "info" and "ValueError" in f["message"]
    assert f["path"] == str(log), f  # one log: the finding points at it
    other = tmp_path / "ok2.log"
    other.write_text("Traceback (most recent call last):\n  File \"y.py\", line 2\nKeyError: 'lr'\n")
    [f] = [f for f in api.forensics([str(log), str(other)]).findings if f.rule == "CKD603"]
    assert f.path == "2 logs" and "in 7 line(s) of 2 log(s)" in f.message, (f.path, f.message)
    assert "the first other failure is ValueError" in f.message, f.message  # not the last one


def test_a_survived_traceback_is_evidence_not_the_failure():
    """DCP logs a FileNotFoundError for .metadata inside a warning and falls back; the failure is the
    AssertionError the load raises after it (real log)."""
    first = api.forensics(_logs("dcp-metadata-missing")).facts["first_failure"]
    assert first["exception"] == "AssertionError" and first["path"].endswith("/.metadata")


def test_a_logged_traceback_without_the_rank_prefix_is_not_the_failure_even_as_the_last_word(tmp_path):
    """The same real log without torchrun's lines (they went to another file): DCP's logged
    FileNotFoundError for __1.metadata is then the last traceback of the unprefixed lines; torch
    prefixes an uncaught rank traceback with [rankN]:, so the unprefixed one was logged and survived."""
    text = open(_logs("dcp-metadata-missing")[0]).read()
    cut = tmp_path / "ranks-only.log"
    cut.write_text(text[:text.index("failed (exitcode")].rsplit("\n", 1)[0] + "\n")
    first = api.forensics([str(cut)]).facts["first_failure"]
    assert first["exception"] == "AssertionError" and first["path"].endswith("/.metadata"), first


def test_gzip_and_per_rank_files_are_read(tmp_path):
    assert _logs("dcp-shard-truncated")[0].endswith(".gz")
    assert api.forensics(_logs("dcp-shard-truncated")).facts["first_failure"]["exception"] == "EOFError"
    plain = tmp_path / "job.log"
    plain.write_bytes(gzip.decompress(open(_logs("dcp-shard-truncated")[0], "rb").read()))
    assert api.forensics([str(plain)]).facts["first_failure"] == \
        dict(api.forensics(_logs("dcp-shard-truncated")).facts["first_failure"], log=str(plain))


@pytest.mark.parametrize("fmt", ["json", "sarif", "concise", "github", "text"])
def test_every_output_format_carries_the_first_failure(fmt):
    rc, out, err = cli("forensics", *_logs("deepspeed-optim-missing"), "--format", fmt)
    assert rc == 0 and "Traceback" not in err, err
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt" in out
    if fmt == "json":
        import jsonschema
        from ckptdoctor.report.schemas import report
        doc = json.loads(out)
        jsonschema.validate(doc, report())
        assert set(doc["facts"]) >= {"first_failure", "class", "timed_out_ranks", "logs"}
        assert doc["facts"]["first_failure"]["line"] > 0 and doc["facts"]["first_failure"]["log"]


def test_bad_logs_are_one_line_errors(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for arg in (str(fifo), str(tmp_path / "absent.log"), str(tmp_path)):
        rc, out, err = cli("forensics", arg, timeout=20)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (arg, rc, err)
    junk = tmp_path / "junk.log"
    junk.write_bytes(bytes(range(256)) * 64 + b"\x1f\x8b broken")
    rc, out, err = cli("forensics", str(junk))
    assert rc == 0 and "Traceback" not in err
    bad_gz = tmp_path / "cut.log.gz"
    bad_gz.write_bytes(open(_logs("dcp-shard-truncated")[0], "rb").read()[:400])
    rc, out, err = cli("forensics", str(bad_gz))
    assert rc == 0 and "Traceback" not in err, err


def test_an_over_long_line_is_cut_not_held(tmp_path):
    from ckptdoctor.forensics import logs as L
    log = tmp_path / "long.log"
    with open(log, "wb") as fh:
        fh.write(b"x" * (5 * L.MAX_LINE) + b"\nFileNotFoundError: [Errno 2] No such file or directory: '/c/__0_0.distcp'\n")
    with open(log, "ab") as fh:   # and one longer than a whole read block
        fh.write(b"y" * (L.BLOCK + 3 * L.MAX_LINE) + b"\nEOFError\n")
    got = list(L.lines(str(log)))
    assert [len(g[3]) for g in got[:-1]][::2] == [L.MAX_LINE, L.MAX_LINE], [len(g[3]) for g in got[:-1]]
    assert got[1][3].startswith("FileNotFoundError") and got[3][3] == "EOFError" and got[-1][0] == 4
    hot = list(L.lines(str(log), (b"rror",)))
    assert [g[0] for g in hot] == [2, 4, 4] and hot[0][3].startswith("FileNotFoundError")


@pytest.mark.slow
def test_a_large_log_is_read_in_bounded_memory(tmp_path):
    """~300 MB of training noise and timeouts around one real failure: peak RSS stays far below the
    log (the README promises bounded memory; benchmarks/forensics_log.py measures 2 GB)."""
    import subprocess
    import sys
    real = open(_logs("deepspeed-optim-missing")[1]).read()
    noise = "".join(f"2026-12-03 17:14:{i % 60:02d}.000 rank{i % 8} INFO step {i} loss 1.{i % 97}\n"
                    for i in range(20000))
    log = tmp_path / "big.log"
    with open(log, "w") as fh:
        for _ in range(240):
            fh.write(noise)
        fh.write(real)
    assert log.stat().st_size > 250e6
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child of pytest reports pytest's
    code = ("from ckptdoctor import api; "
            f"r = api.forensics([{str(log)!r}]); "
            "hwm = next(ln.split()[1] for ln in open('/proc/self/status') if ln.startswith('VmHWM')); "
            "print(r.facts['first_failure']['exception'], hwm)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    exc, rss_kib = out.stdout.split()
    assert exc == "FileNotFoundError"
    assert int(rss_kib) < 100 * 1024, f"peak RSS {int(rss_kib) // 1024} MiB for a {log.stat().st_size >> 20} MiB log"


def test_every_signature_matches_its_example_first_and_the_prefilter_sees_it():
    """A signature whose regex drifted from its example, or that an earlier entry shadows, or whose
    plain-line text holds none of the prefilter's keywords, would never fire on a real log."""
    from ckptdoctor.forensics import analyse as A
    for s in A.signatures():
        got = A.match(s["example"])
        assert got is not None and got["id"] == s["id"], (s["id"], got and got["id"])
        assert any(k in s["example"].lower() for k in A.KEYWORDS), s["id"]


@pytest.mark.parametrize("name", [n for n in CASES if DOC["cases"][n]["truth"]["class"] == "file"])
def test_a_file_failures_hint_names_the_ckptdoctor_command_that_fixes_it_with_the_jobs_paths(tmp_path, name):
    """Issue 41: from the first failure's hint straight to the fixing command.  A file-class failure
    names a ckptdoctor command; with --run-root the command carries that run root, never the
    RUN_ROOT placeholder."""
    rep = api.forensics(_logs(name))
    hit = assert_fires(rep, "CKD601", severity="warning")[0]
    assert "`ckptdoctor " in hit.hint, hit.hint
    assert "CHECKPOINT" not in hit.hint or not rep.facts["first_failure"]["path"], hit.hint
    if os.path.isdir(os.path.join(BASE, name, "run")):
        root = shutil.copytree(os.path.join(BASE, name, "run"), tmp_path / "run", symlinks=True)
        rc, out, err = cli("forensics", *_logs(name), "--run-root", str(root), "--format", "json")
        [f] = [f for f in json.loads(out)["findings"] if f["rule"] == "CKD601"]
        assert "RUN_ROOT" not in f["hint"] and "CHECKPOINT" not in f["hint"], f["hint"]


def test_many_ranks_are_named_by_the_first_eight_and_the_exact_count_of_the_rest():
    """A 4,096-rank job's timeouts must not print 4,096 numbers, nor hide how many there were:
    up to eight ranks are named, the rest counted exactly ("and 2 more"); one is "rank N"."""
    from types import SimpleNamespace as NS
    from ckptdoctor.checks import forensics as F
    first = {"ranks": [5], "log": "job.log", "line": 7, "exception": "FileNotFoundError", "message": None,
             "path": None, "time": None, "what": "a file is missing", "certain": True, "class": "file", "fix": None}
    for after, said in (([1, 2], "ranks 1, 2 only"), (list(range(8)), "ranks 0, 1, 2, 3, 4, 5, 6, 7 only"),
                        (list(range(9)), "ranks 0, 1, 2, 3, 4, 5, 6, 7 and 1 more only"),
                        (list(range(10)), "ranks 0, 1, 2, 3, 4, 5, 6, 7 and 2 more only"),
                        (list(range(20)), "ranks 0, 1, 2, 3, 4, 5, 6, 7 and 12 more only")):
        sub = NS(analysis=NS(first=first, failed_after=after), checkpoint=None, run_root=None)
        [hit] = list(F.failed_after(sub, None))
        assert hit.message.startswith(said + " failed after it"), (said, hit.message)
    sub = NS(analysis=NS(first=first, failed_after=[]), checkpoint=None, run_root=None)
    [hit] = list(F.first_failure(sub, None))
    assert hit.message.startswith("rank 5 failed first: FileNotFoundError"), hit.message
