"""The damage matrix shared by the conformance generators and the suite.

A generator writes healthy checkpoints with the real library, applies each case below to a copy, runs
the real library's load or resume on it and records what happened (tests/fixtures/real/*/outcomes.json).
The suite applies the same case to a copy of the committed healthy fixture and checks that
`ckptdoctor verify` agrees with the recorded outcome.  A case is data (an op list), so both sides
apply it by the same code and nothing is re-described in the test.

Ops, all relative to the run root:
  ["truncate", path]          cut the file to half its size (a copy or write cut short)
  ["delete", path]            remove a file (a rank's save that never happened, a copy that skipped it)
  ["delete_glob", dir, glob]  remove every file of dir matching glob
  ["write", path, text]       (re)write a small file (a tracker naming something else)
  ["mkdir", path]             an empty directory (a step directory a killed save created first)
  ["copy_partial", src, dst, glob]  a newer save killed early: dst holds only src's files matching glob
  ["copy_cut", src, dst]      a newer single-file save killed early: dst is the first half of src
  ["link", path, target]      (re)point a symbolic link (a tracker that is a link, e.g. Composer's)
  ["deref", path]             replace a symbolic link with a copy of what it points to (cp -L, rsync -L)
  ["unreadable", path]        mode 000 (a file or directory written under another user's umask, a copy
                              that kept modes): the load and verify then run without root's
                              CAP_DAC_OVERRIDE (`unprivileged()`), so the permission bites as it would
                              for the job's user
  ["unlistable", dir]         mode 311: its files open by name, but it cannot be listed
"""
from __future__ import annotations

import fnmatch
import os
import shutil


def apply(root: str, ops: list) -> None:
    for op in ops:
        kind, args = op[0], op[1:]
        if kind == "truncate":
            p = os.path.join(root, args[0])
            os.truncate(p, os.path.getsize(p) // 2)
        elif kind == "delete":
            os.remove(os.path.join(root, args[0]))
        elif kind == "delete_glob":
            d = os.path.join(root, args[0])
            for n in os.listdir(d):
                if fnmatch.fnmatchcase(n, args[1]):
                    os.remove(os.path.join(d, n))
        elif kind == "write":
            with open(os.path.join(root, args[0]), "w") as fh:
                fh.write(args[1])
        elif kind == "mkdir":
            os.makedirs(os.path.join(root, args[0]))
        elif kind == "copy_partial":
            src, dst = os.path.join(root, args[0]), os.path.join(root, args[1])
            os.makedirs(dst)
            for n in sorted(os.listdir(src)):
                if fnmatch.fnmatchcase(n, args[2]):
                    shutil.copy2(os.path.join(src, n), os.path.join(dst, n))
        elif kind == "copy_cut":
            src, dst = os.path.join(root, args[0]), os.path.join(root, args[1])
            with open(src, "rb") as fh, open(dst, "wb") as out:
                out.write(fh.read(os.path.getsize(src) // 2))
        elif kind == "link":
            p = os.path.join(root, args[0])
            if os.path.lexists(p):
                os.remove(p)
            os.symlink(args[1], p)
        elif kind == "deref":
            p = os.path.join(root, args[0])
            real = os.path.realpath(p)
            os.remove(p)
            shutil.copy2(real, p)
        elif kind == "unreadable":
            os.chmod(os.path.join(root, args[0]), 0)
        elif kind == "unlistable":
            os.chmod(os.path.join(root, args[0]), 0o311)
        else:
            raise ValueError(f"unknown damage op {kind!r}")


def unprivileged(ops: list) -> list[str]:
    """Command prefix for a case with an unreadable file: as root (how the generators and CI run),
    drop the two capabilities that bypass permission bits, so the process meets a real EACCES."""
    if not any(op[0] in ("unreadable", "unlistable") for op in ops) or os.geteuid() != 0:
        return []
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]


def copy_and_apply(src: str, dst: str, ops: list) -> str:
    shutil.copytree(src, dst, symlinks=True)
    apply(dst, ops)
    return dst


def run_worker(script: str, mode: str, root: str, env: dict, timeout: float = 600, prefix: list | None = None) -> dict:
    """`script --worker MODE --root ROOT --result FILE` in a fresh process (one-process generators):
    the JSON it wrote, or {"raised": ...} when the process died before writing one.  `prefix`: a
    command to run it under (`unprivileged(ops)`)."""
    import json
    import subprocess
    import sys
    import tempfile
    with tempfile.TemporaryDirectory() as t:
        res = os.path.join(t, "r.json")
        subprocess.run([*(prefix or []), sys.executable, script, "--worker", mode, "--root", root, "--result", res],
                       env=dict(os.environ, **env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=timeout)
        try:
            with open(res) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return {"raised": "no result (the process died)"}


# ---- what every one-process generator does around its own save, load and labels ------------------
def generator_args(doc: str, library_dir: str):
    """The generators' command line: `--out DIR` (default tests/fixtures/real/<library_dir>), and the
    worker mode a generator runs itself in (`--worker MODE --root ROOT --result FILE`)."""
    import argparse
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "fixtures", "real", library_dir))
    ap.add_argument("--worker"), ap.add_argument("--root"), ap.add_argument("--result")
    ap.add_argument("--cases", help="comma-separated case names: label only these against the committed healthy "
                                    "fixture and merge them into its outcomes.json (the fixture is not rewritten)")
    return ap.parse_args()


def run_cases(doc: dict, stage: str, healthy: str, cases: list[dict], judge) -> None:
    """Each case applied to a fresh copy of the healthy run root, judged by the real library:
    `judge(root, case) -> (outcome, detail)`; the temporary paths are masked in what is recorded."""
    import tempfile
    for case in cases:
        with tempfile.TemporaryDirectory() as t:
            root = copy_and_apply(healthy, os.path.join(t, "run"), case["ops"])
            outcome, detail = judge(root, case)
            detail = [d.replace(root, "<root>").replace(t, "<tmp>") if isinstance(d, str) else d for d in detail]
        rec = {"ops": case["ops"], "names": case["names"], "outcome": outcome, "detail": detail}
        rec.update({k: case[k] for k in ("load",) if case.get(k)})
        doc["stages"][stage]["cases"][case["name"]] = rec
        print(f"{stage} {case['name']}: {outcome} {detail}", flush=True)


def relabel(out: str, version: str, stage: str, healthy: str, cases: list[dict], names: str, judge) -> None:
    """`--cases a,b`: label only the named cases against the committed healthy fixture (made with
    this library `version`) and merge them into its outcomes.json; the fixture is not rewritten."""
    import json
    with open(os.path.join(out, "outcomes.json")) as fh:
        doc = json.load(fh)
    assert doc["version"] == version, f"the fixture was made with {doc['version']}, this is {version}"
    want = names.split(",")
    run_cases(doc, stage, healthy, [c for c in cases if c["name"] in want], judge)
    write_outcomes(out, doc)


def write_outcomes(out: str, doc: dict) -> None:
    import json
    with open(os.path.join(out, "outcomes.json"), "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.write("\n")
