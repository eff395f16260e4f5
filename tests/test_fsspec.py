"""verify over fsspec URLs: listings and sizes only, same findings as on a local disk."""
import fsspec

from ckptdoctor import api
from ckptdoctor.demo import build_run
from helpers import assert_fires


def _upload(local, url):
    fs = fsspec.filesystem("memory")
    fs.put(str(local), url, recursive=True)
    return fs


def test_memory_url_run_root_matches_local(tmp_path):
    build_run(str(tmp_path / "run"))
    local = api.verify(str(tmp_path / "run"))
    _upload(tmp_path / "run", "memory://bucket/run")
    remote = api.verify("memory://bucket/run")
    assert sorted((f.rule, f.path.rsplit("/run/", 1)[-1]) for f in remote.findings if f.rule != "CKD105") == \
        sorted((f.rule, f.path.rsplit("/run/", 1)[-1]) for f in local.findings if f.rule != "CKD105")
    assert_fires(remote, "CKD104", path_contains="memory://bucket/run/iter_0000300")
    assert remote.facts["newest_complete"] == "iter_0000100"


def test_real_s3_server_run_root(tmp_path, s3):
    """A real S3-compatible server (moto's, on loopback) through s3fs: the same findings as on
    local disk, via the CLI a user runs, with the endpoint given the way fsspec reads it."""
    import json
    from helpers import cli
    env, fs, bucket = s3
    build_run(str(tmp_path / "run"))
    local = api.verify(str(tmp_path / "run"))
    fs.put(str(tmp_path / "run"), f"{bucket}/run", recursive=True)
    rc, out, err = cli("verify", "--format", "json", f"s3://{bucket}/run", env=env)
    assert rc == 1, err
    rep = json.loads(out)
    got = sorted((f["rule"], f["path"].rsplit("/run/", 1)[-1]) for f in rep["findings"]
                 if f["rule"] not in ("CKD105", "CKD107"))
    want = sorted((f.rule, f.path.rsplit("/run/", 1)[-1]) for f in local.findings
                  if f.rule not in ("CKD105", "CKD107"))
    assert got == want, (got, want)
    assert any(r == "CKD104" and p.startswith("iter_0000300/") for r, p in got), got
    assert rep["facts"]["newest_complete"] == "iter_0000100"
