"""preflight on a real Slurm cluster (3 slurmd 'nodes' on loopback): the shipped first-step script
and the always-exit-0 Prolog wrapper stop a job whose node-local shards are stranded, say why, and
drain no node.  Skipped (loudly) only when slurm-wlm cannot be run here; .ci/run installs it."""
import os
import shutil
import tempfile
import sys
import time
import warnings
from pathlib import Path

import pytest

from ckptdoctor.slurm.hostlist import compress, expand

import slurm_lab
from helpers import node_local_dcp

REPO = Path(__file__).resolve().parent.parent
CKD = str(Path(sys.executable).parent / "ckptdoctor")
WHY = slurm_lab.missing()
if WHY:
    warnings.warn(f"REAL-SLURM TESTS SKIPPED: {WHY}")
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"REAL-SLURM TESTS SKIPPED: {WHY}")


ENV = {"node": f"export CKPTDOCTOR={CKD}", "ctld": f"export CKPTDOCTOR={CKD}",
       "badbin": "export CKPTDOCTOR=/opt/nowhere/bin/ckptdoctor",       # an admin's broken install
       "badhold": "export CKPTDOCTOR=/opt/nowhere/bin/ckptdoctor CKPTDOCTOR_ON_ERROR=hold"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurmlab")
    os.chmod(root, 0o755)
    hooks = {}
    for name, script, tags in (("prolog.sh", "prolog-wrapper.sh", ("node", "badbin", "badhold")),
                               ("prolog_ctld.sh", "prolog-slurmctld.sh", ("ctld",))):
        p = root / name  # one lab, two hooks: a job picks one (and a broken install) with its comment
        # the lab's slurm.conf is not at the default path, and PrologSlurmctld gets no SLURM_CONF
        cases = "".join(f"  *hook={t}\\ *|*hook={t}) {ENV[t]} ;;\n" for t in tags)
        p.write_text(f"#!/bin/bash\ncase \"$SLURM_JOB_COMMENT\" in\n{cases}  *) exit 0 ;;\nesac\n"
                     f"export SLURM_CONF={root}/etc/slurm.conf CKPTDOCTOR_PROLOG_LOG={root}/prolog.log\n"
                     f"exec {REPO}/scripts/slurm/{script}\n")
        p.chmod(0o755)
        hooks[name] = str(p)
    lab = slurm_lab.Lab(root, prolog=hooks["prolog.sh"], prolog_ctld=hooks["prolog_ctld.sh"])
    try:
        lab.start()
        yield lab
    finally:
        lab.stop()


@pytest.fixture
def nodes_root(tmp_path):
    """A 6-rank DCP checkpoint spread node-locally over n1..n3 (2 ranks each), tracker everywhere."""
    return node_local_dcp(tmp_path, slurm_lab.NODES, 2)


def test_hostlist_matches_scontrol(lab):
    for expr in ["gpu[001-004,010]", "rack[1-2]-gpu[01-02],login1", "n[1-10]", "n[001-4]", "x[1-3,5]y[2-3]",
                 "a1,b1,a2", "n[09-11]", "n[0-2],m7"]:
        got = lab.run(["scontrol", "show", "hostnames", expr])
        assert got.returncode == 0, got.stderr
        assert expand(expr) == got.stdout.split(), expr
        back = lab.run(["scontrol", "show", "hostlist", ",".join(expand(expr))]).stdout.strip()
        assert compress(expand(expr)) == back, expr
    for bad in ["gpu[3-1]", "gpu[a-b]", "a[1-2]b"]:
        r = lab.run(["scontrol", "show", "hostnames", bad])
        assert r.returncode != 0 or "Invalid hostlist" in r.stdout + r.stderr, bad
        with pytest.raises(ValueError):
            expand(bad)


def _job(tmp_path, body: str, **sbatch) -> Path:
    script = tmp_path / f"job{time.time_ns()}.sh"
    opts = "\n".join(f"#SBATCH {k}" for k in sbatch.get("opts", []))
    script.write_text(f"#!/bin/bash\n{opts}\n{body}\n")
    script.chmod(0o755)
    return script


def _train_body(nodes_root, trained):
    return (f"export CKPTDOCTOR={CKD}\n"
            f"{REPO}/scripts/slurm/preflight-step.sh '{nodes_root}/{{node}}/run7' || exit $?\n"
            f"srun bash -c 'touch {trained}/rank.$SLURM_PROCID'\n")


def test_first_step_preflight_lets_a_healthy_job_train(lab, nodes_root, tmp_path):
    trained = tmp_path / "trained"
    trained.mkdir()
    os.chmod(tmp_path, 0o755)
    out = tmp_path / "ok.out"
    job = _job(tmp_path, _train_body(nodes_root, trained), opts=["-N3", "--ntasks-per-node=2", f"-o {out}"])
    r = lab.run(["sbatch", "--wait", str(job)], timeout=120)
    assert r.returncode == 0, (r.stderr, out.read_text() if out.exists() else "")
    assert sorted(os.listdir(trained)) == [f"rank.{i}" for i in range(6)]
    lines = out.read_text().splitlines()  # the job log: one line per node and one summary, no tables
    assert sorted(x.split(":")[0] for x in lines if x.startswith("preflight ")) == \
        ["preflight n1 (ranks 0-1)", "preflight n2 (ranks 2-3)", "preflight n3 (ranks 4-5)"], lines
    assert len(lines) == 4 and "every node" in lines[-1] and all(len(x) < 160 for x in lines), lines


def test_first_step_preflight_stops_job_with_stranded_shards(lab, nodes_root, tmp_path):
    for f in (nodes_root / "n2" / "run7" / "iter_0000100").glob("__*_0.distcp"):
        f.unlink()  # n2 was replaced: its node-local shards are gone
    trained = tmp_path / "trained"
    trained.mkdir()
    os.chmod(tmp_path, 0o755)
    out = tmp_path / "bad.out"
    job = _job(tmp_path, _train_body(nodes_root, trained), opts=["-N3", "--ntasks-per-node=2", f"-o {out}"])
    r = lab.run(["sbatch", "--wait", str(job)], timeout=120)
    text = out.read_text()
    assert r.returncode != 0, text
    assert os.listdir(trained) == []  # training never started
    assert "CKD401" in text and "node n2" in text and "ranks 2,3" in text, text
    assert "not starting training" in text
    assert lab.states() == {n: "idle" for n in slurm_lab.NODES}  # no node drained


@pytest.mark.parametrize("hook", ["node", "ctld"])
def test_prolog_hooks_hold_job_without_draining(lab, nodes_root, tmp_path, hook):
    (nodes_root / "n3" / "run7" / "iter_0000100" / ".metadata").unlink()
    trained = tmp_path / "trained"
    trained.mkdir()
    os.chmod(tmp_path, 0o755)
    job = _job(tmp_path, f"srun bash -c 'touch {trained}/rank.$SLURM_PROCID'",
               opts=["-N3", "--ntasks-per-node=2", f"-o {tmp_path}/p.out"])
    r = lab.run(["sbatch", "--parsable", f"--comment=ckptdoctor={nodes_root}/{{node}}/run7 ranks=2 hook={hook}", str(job)])
    assert r.returncode == 0, r.stderr
    jobid = r.stdout.strip().split(";")[0]
    try:
        j = lab.wait_job(jobid, states=("HELD", "COMPLETED", "FAILED", "CANCELLED"), timeout=60)
        assert j["JobState"] == "PENDING" and "held" in j["Reason"].lower(), j  # JobHeldAdmin or job_requeued_in_held_state
        ac = j.get("AdminComment", "")
        assert "CKD403" in ac and "n3" in ac and "iter_0000100/.metadata" in ac and len(ac) <= 400, j  # rule, node, file
        assert lab.states() == {n: "idle" for n in slurm_lab.NODES}
        assert os.listdir(trained) == []
    finally:
        lab.run(["scancel", jobid])
        lab.resume_all()
    # the same job with the checkpoint repaired runs through the wrapper
    shutil.copy2(nodes_root / "n1" / "run7" / "iter_0000100" / ".metadata",
                 nodes_root / "n3" / "run7" / "iter_0000100" / ".metadata")
    r = lab.run(["sbatch", "--parsable", "--wait",
                 f"--comment=ckptdoctor={nodes_root}/{{node}}/run7 ranks=2 hook={hook}", str(job)], timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(trained)) == [f"rank.{i}" for i in range(6)]


def _submit(lab, job, comment, user=None):
    cmd = ["sbatch", "--parsable", f"--comment={comment}", str(job)]
    r = lab.run(["runuser", "-u", user, "--", *cmd] if user else cmd)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def test_a_broken_install_does_not_hold_the_job_and_says_why(lab, nodes_root, tmp_path):
    """The Prolog's binary is missing (an admin's broken install): the opted-in job runs anyway, and
    the real error goes to the log; CKPTDOCTOR_ON_ERROR=hold holds it instead, saying why."""
    trained = tmp_path / "trained"
    trained.mkdir()
    os.chmod(tmp_path, 0o755)
    job = _job(tmp_path, f"srun bash -c 'touch {trained}/rank.$SLURM_PROCID'",
               opts=["-N3", "--ntasks-per-node=2", f"-o {tmp_path}/p.out"])
    log = Path(lab.root) / "prolog.log"
    r = lab.run(["sbatch", "--parsable", "--wait", f"--comment=ckptdoctor={nodes_root}/{{node}}/run7 ranks=2 hook=badbin",
                 str(job)], timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(trained)) == [f"rank.{i}" for i in range(6)]
    text = log.read_text()
    assert "cannot run /opt/nowhere/bin/ckptdoctor (exit 127)" in text and "job proceeds" in text, text
    jobid = _submit(lab, job, f"ckptdoctor={nodes_root}/{{node}}/run7 ranks=2 hook=badhold")
    try:
        j = lab.wait_job(jobid, states=("HELD", "COMPLETED", "FAILED", "CANCELLED"), timeout=60)
        assert j["JobState"] == "PENDING" and "could not run" in j.get("AdminComment", ""), j
        assert lab.states() == {n: "idle" for n in slurm_lab.NODES}
    finally:
        lab.run(["scancel", jobid])
        lab.resume_all()


import contextlib


@contextlib.contextmanager
def _searchable_for_others(paths):
    """Let an unprivileged user reach the interpreter, the venv and the clone for the test's duration
    (CI runs as root with the interpreter under /root, 0700): add o+x to each ancestor directory
    that lacks it, and put every mode back afterwards."""
    changed = []
    for p in paths:
        for d in [*reversed(Path(p).resolve().parents)]:
            m = os.stat(d).st_mode
            if not m & 0o001:
                changed.append((d, m))
                os.chmod(d, m | 0o001)
    try:
        yield
    finally:
        for d, m in reversed(changed):
            os.chmod(d, m & 0o7777)


def test_the_prolog_reads_as_the_jobs_user_not_as_root(lab, nodes_root, tmp_path):
    """A healthy checkpoint under a root-only directory: root's own job passes the Prolog, while the
    same comment from an unprivileged user's job is judged with that user's rights (it cannot read
    the directory, so it is held) and its AdminComment names nothing inside the directory."""
    secret = tmp_path / "secret"
    shutil.copytree(nodes_root, secret / "nodes")
    for d in {*Path(lab.root).parents, Path(lab.root), *tmp_path.parents, tmp_path}:
        if str(d).startswith(tempfile.gettempdir() + "/") or d == Path(lab.root):  # pytest's 0700 base ($TMPDIR
            # or /tmp): let the job's user pass
            os.chmod(d, os.stat(d).st_mode | 0o011)
    os.chmod(secret, 0o700)
    pub = tmp_path / "pub"
    pub.mkdir()
    os.chmod(pub, 0o1777)
    job = _job(pub, "true", opts=["-N3", "--ntasks-per-node=2", f"-o {pub}/%j.out"])
    comment = f"ckptdoctor={secret}/nodes/{{node}}/run7 ranks=2 hook=node"
    r = lab.run(["sbatch", "--parsable", "--wait", f"--comment={comment}", str(job)], timeout=120)
    assert r.returncode == 0, r.stderr  # root may read it: the Prolog passes root's job
    with _searchable_for_others([sys.executable, CKD, REPO / "ckptdoctor" / "cli.py"]):
        jobid = _submit(lab, job, comment, user="nobody")
        j = lab.wait_job(jobid, states=("HELD", "COMPLETED", "FAILED", "CANCELLED"), timeout=60)
    try:
        ac = j.get("AdminComment", "")
        assert j["JobState"] == "PENDING" and "ermission denied" in ac, j
        assert "iter_0000100" not in ac and ".distcp" not in ac, ac  # nothing root could see leaks out
    finally:
        lab.run(["scancel", jobid])
        lab.resume_all()


def test_replacement_node_with_an_empty_disk_stops_the_job(lab, nodes_root, tmp_path):
    shutil.rmtree(nodes_root / "n2" / "run7")
    (nodes_root / "n2" / "run7").mkdir()  # n2 was replaced: its NVMe is empty
    os.chmod(nodes_root / "n2" / "run7", 0o755)
    trained = tmp_path / "trained"
    trained.mkdir()
    os.chmod(tmp_path, 0o755)
    out = tmp_path / "empty.out"
    job = _job(tmp_path, _train_body(nodes_root, trained), opts=["-N3", "--ntasks-per-node=2", f"-o {out}"])
    r = lab.run(["sbatch", "--wait", str(job)], timeout=120)
    text = out.read_text()
    assert r.returncode != 0, text
    assert os.listdir(trained) == []
    assert "CKD409" in text and "node n2" in text and "ranks 2,3" in text, text
    assert lab.states() == {n: "idle" for n in slurm_lab.NODES}


def test_a_declared_fresh_start_runs_on_empty_disks(lab, tmp_path):
    os.chmod(tmp_path, 0o755)
    root = tmp_path / "nodes"
    for n in slurm_lab.NODES:
        (root / n / "run7").mkdir(parents=True)
    for d in [root] + [root / n for n in slurm_lab.NODES] + [root / n / "run7" for n in slurm_lab.NODES]:
        os.chmod(d, 0o755)
    trained = tmp_path / "trained"
    trained.mkdir()
    os.chmod(trained, 0o777)
    for fresh, want_rc in (("", 1), (" --allow-fresh", 0)):
        out = tmp_path / f"fresh{bool(fresh)}.out"
        body = (f"export CKPTDOCTOR={CKD}\n"
                f"{REPO}/scripts/slurm/preflight-step.sh '{root}/{{node}}/run7'{fresh} || exit $?\n"
                f"srun bash -c 'touch {trained}/rank.$SLURM_PROCID'\n")
        job = _job(tmp_path, body, opts=["-N3", "--ntasks-per-node=2", f"-o {out}"])
        r = lab.run(["sbatch", "--wait", str(job)], timeout=120)
        assert (r.returncode == 0) == (want_rc == 0), out.read_text()
        if want_rc:
            assert "CKD409" in out.read_text() and os.listdir(trained) == []
    assert sorted(os.listdir(trained)) == [f"rank.{i}" for i in range(6)]


def test_first_step_judges_the_whole_allocation_from_every_nodes_view(lab, nodes_root, tmp_path):
    """Each node alone is fine; together they would resume from different checkpoints."""
    for n in slurm_lab.NODES:  # a newer checkpoint everywhere, but n3's tracker still names the old one
        shutil.copytree(nodes_root / n / "run7" / "iter_0000100", nodes_root / n / "run7" / "iter_0000200")
        (nodes_root / n / "run7" / "latest_checkpointed_iteration.txt").write_text("200")
    (nodes_root / "n3" / "run7" / "latest_checkpointed_iteration.txt").write_text("100")
    scratch = tmp_path / "views"
    scratch.mkdir()
    os.chmod(scratch, 0o777)
    trained = tmp_path / "trained"
    trained.mkdir()
    os.chmod(tmp_path, 0o755)
    out = tmp_path / "views.out"
    body = f"export CKPTDOCTOR_VIEWS_DIR={scratch}\n" + _train_body(nodes_root, trained)
    job = _job(tmp_path, body, opts=["-N3", "--ntasks-per-node=2", f"-o {out}"])
    r = lab.run(["sbatch", "--wait", str(job)], timeout=120)
    text = out.read_text()
    assert r.returncode != 0 and os.listdir(trained) == [], text
    assert "CKD404" in text and "n3: iter_0000100" in text, text


def test_publish_parts_from_every_node_with_srun(lab, nodes_root, tmp_path):
    """issue 17: one `srun --ntasks-per-node=1 ckptdoctor publish --part $SLURM_NODEID/$SLURM_NNODES`
    per node assembles the checkpoint no single node holds; one part commits, the tracker moves."""
    import json
    for n in slurm_lab.NODES:  # as Megatron saves it: every node writes the same metadata.json
        (nodes_root / n / "run7" / "iter_0000100" / "metadata.json").write_text(
            '{"sharded_backend": "torch_dist", "sharded_backend_version": 1}')
    dest = tmp_path / "lustre"
    dest.mkdir()
    os.chmod(dest, 0o777)
    out = tmp_path / "pub.out"
    job = _job(tmp_path, f"srun --ntasks-per-node=1 bash -c '{CKD} publish --quiet --format json "
                         f"{nodes_root}/$SLURMD_NODENAME/run7/iter_0000100 {dest}/run7 "
                         f"--part $SLURM_NODEID/$SLURM_NNODES --publish-id $SLURM_JOB_ID "
                         f"> {tmp_path}/part.$SLURM_NODEID.json'",
               opts=["-N3", f"-o {out}"])
    r = lab.run(["sbatch", "--wait", str(job)], timeout=180)
    assert r.returncode == 0, (r.stderr, out.read_text() if out.exists() else "")
    docs = [json.loads((tmp_path / f"part.{k}.json").read_text())["facts"]["published"] for k in range(3)]
    assert sorted(d["status"] for d in docs) == ["committed", "part-done", "part-done"]
    assert {d["publish_id"] for d in docs} == {docs[0]["publish_id"]} and docs[0]["publish_id"].isdigit()
    assert (dest / "run7" / "latest_checkpointed_iteration.txt").read_text() == "100"
    shards = sorted(p.name for n in slurm_lab.NODES for p in (nodes_root / n / "run7" / "iter_0000100").glob("*.distcp"))
    assert sorted(p.name for p in (dest / "run7" / "iter_0000100").glob("*.distcp")) == shards
    from helpers import cli
    rc, o, e = cli("verify", "--checksums", str(dest / "run7"))
    assert rc == 0, o + e
    assert not [e for e in os.listdir(dest / "run7") if "ckptdoctor-parts" in e]
