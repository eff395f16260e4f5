"""Assertions shared by the tests.  `assert_fires(report, "CKDnnn")` is how a test proves a rule
fires; test_catalog.py requires one such call per catalog rule."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys


# Rule ids a test has seen fire (asserted through assert_fires*): conftest.py checks at the end of a
# full run that every catalog rule is in it, so "every rule has a test that makes it fire" is an
# observation of real findings, not a text search.
FIRED: set[str] = set()


def assert_fires(report, rule: str, *, path_contains: str | None = None, severity: str | None = None):
    """`rule` fired (on a path containing `path_contains`) with `severity`; without one, with the
    severity its catalog entry promises (issue 39: a finding demoted from error to warning is a
    broken promise, so every call pins a severity, the default one unless it says otherwise)."""
    hits = [f for f in report.findings if f.rule == rule]
    assert hits, f"{rule} did not fire; findings: {[(f.rule, f.message) for f in report.findings]}"
    FIRED.add(rule)
    if path_contains:
        hits = [f for f in hits if path_contains in f.path] or hits
        assert any(path_contains in f.path for f in hits), [f.path for f in hits]
    if severity is None:
        from ckptdoctor.engine.catalog import catalog
        severity = catalog()[rule].severity
    assert any(f.severity == severity for f in hits), \
        f"{rule} fired as {sorted({f.severity for f in hits})}, promised {severity}: {[f.message for f in hits]}"
    return hits


def assert_fires_json(doc: dict, rule: str, *, path_contains: str | None = None, severity: str | None = None):
    """assert_fires for a `--format json` report read back from the real CLI (severity pinned the same way)."""
    hits = [f for f in doc["findings"] if f["rule"] == rule]
    assert hits, f"{rule} did not fire; findings: {[(f['rule'], f['message']) for f in doc['findings']]}"
    FIRED.add(rule)
    if path_contains:
        hits = [f for f in hits if path_contains in f["path"]] or hits
        assert any(path_contains in f["path"] for f in hits), [f["path"] for f in hits]
    if severity is None:
        from ckptdoctor.engine.catalog import catalog
        severity = catalog()[rule].severity
    assert any(f["severity"] == severity for f in hits), \
        f"{rule} fired as {sorted({f['severity'] for f in hits})}, promised {severity}: {[f['message'] for f in hits]}"
    return hits


def assert_no_errors(report):
    errs = [(f.rule, f.path, f.message) for f in report.findings if f.severity == "error"]
    assert not errs, errs


def terminal_sigint() -> None:
    """preexec_fn for a child the test will Ctrl-C: SIGINT as a terminal delivers it.  A suite
    started in the background (`pytest &` from a script) hands its children SIGINT ignored, and
    Python then installs no KeyboardInterrupt handler, so the interrupt would be lost."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli(*args, env=None, cwd=None, input=None, timeout=120):
    """Run the real console entry point in a subprocess: (rc, stdout, stderr)."""
    e = dict(os.environ)
    e.pop("CKPTDOCTOR_CONFIG", None)
    e.update(env or {})
    p = subprocess.run([sys.executable, "-m", "ckptdoctor", *args], capture_output=True, text=True,
                       env=e, cwd=cwd, input=input, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def as_unprivileged() -> list[str]:
    """Command prefix that makes permission bits bite.  As root (how CI runs) drop the two
    capabilities that bypass them, so the real CLI meets a real EACCES; otherwise none needed."""
    if os.geteuid() != 0:
        return []
    import shutil
    import pytest
    if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv(1): cannot drop CAP_DAC_OVERRIDE")
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]


def spread(src_ckpt, root, nodes, per_node, name="iter_0000100", tracker="100", skip=()):
    """Copy a real checkpoint into per-node roots the way node-local saving leaves it: each node
    holds its own ranks' shards plus the global files."""
    for i, n in enumerate(nodes):
        d = os.path.join(root, n, "run7", name)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(src_ckpt):
            if (n, f) in skip:
                continue
            if f.startswith("__") and f.endswith(".distcp"):
                if int(f[2:].split("_")[0]) // per_node != i:
                    continue
            shutil.copy2(os.path.join(src_ckpt, f), d)
        if tracker is not None:
            with open(os.path.join(root, n, "run7", "latest_checkpointed_iteration.txt"), "w") as fh:
                fh.write(tracker)
    return os.path.join(root, "{node}", "run7")


def node_local_dcp(tmp_path, nodes, per_node):
    """A DCP checkpoint written by ckptdoctor's torch-free writer (torch's on-disk format; the torch
    tests load its output with the real dcp.load) of len(nodes) x per_node ranks, spread node-locally
    with `spread`; returns the nodes root (tmp_path/nodes).  Readable by other users (Slurm, sshd)."""
    from ckptdoctor.layouts import dcp_writer as W
    src = tmp_path / "src" / "iter_0000100"
    world = len(nodes) * per_node
    W.write(str(src), [W.Item("w", (2 * world, 4), (2 * r, 0), (2, 4), [float(r)] * 8, rank=r) for r in range(world)])
    spread(src, tmp_path / "nodes", nodes, per_node)
    os.chmod(tmp_path, 0o755)
    return tmp_path / "nodes"
