"""Assertions shared by the tests.  `assert_fires(report, "CKDnnn")` is how a test proves a rule
fires; test_catalog.py requires one such call per catalog rule."""
from __future__ import annotations

import os
import subprocess
import sys


def assert_fires(report, rule: str, *, path_contains: str | None = None, severity: str | None = None):
    hits = [f for f in report.findings if f.rule == rule]
    assert hits, f"{rule} did not fire; findings: {[(f.rule, f.message) for f in report.findings]}"
    if path_contains:
        assert any(path_contains in f.path for f in hits), [f.path for f in hits]
    if severity:
        assert any(f.severity == severity for f in hits), [f.severity for f in hits]
    return hits


def assert_fires_json(doc: dict, rule: str, *, path_contains: str | None = None):
    """assert_fires for a `--format json` report read back from the real CLI."""
    hits = [f for f in doc["findings"] if f["rule"] == rule]
    assert hits, f"{rule} did not fire; findings: {[(f['rule'], f['message']) for f in doc['findings']]}"
    if path_contains:
        assert any(path_contains in f["path"] for f in hits), [f["path"] for f in hits]
    return hits


def assert_no_errors(report):
    errs = [(f.rule, f.path, f.message) for f in report.findings if f.severity == "error"]
    assert not errs, errs


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
