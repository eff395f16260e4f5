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


def test_real_s3_server_run_root(tmp_path, monkeypatch):
    """A real S3-compatible server (moto's, on loopback) through s3fs: the same findings as on
    local disk, via the CLI a user runs, with the endpoint given the way fsspec reads it."""
    import json
    import pytest
    moto_server = pytest.importorskip("moto.server")
    from helpers import cli
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    srv.start()
    try:
        host, port = srv.get_host_and_port()
        env = {"FSSPEC_S3_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "k",
               "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1"}
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        build_run(str(tmp_path / "run"))
        local = api.verify(str(tmp_path / "run"))
        fs = fsspec.filesystem("s3", endpoint_url=env["FSSPEC_S3_ENDPOINT_URL"], skip_instance_cache=True)
        fs.mkdir("ckpts")
        fs.put(str(tmp_path / "run"), "ckpts/run", recursive=True)
        rc, out, err = cli("verify", "--format", "json", "s3://ckpts/run", env=env)
        assert rc == 1, err
        rep = json.loads(out)
        got = sorted((f["rule"], f["path"].rsplit("/run/", 1)[-1]) for f in rep["findings"]
                     if f["rule"] not in ("CKD105", "CKD107"))
        want = sorted((f.rule, f.path.rsplit("/run/", 1)[-1]) for f in local.findings
                      if f.rule not in ("CKD105", "CKD107"))
        assert got == want, (got, want)
        assert any(r == "CKD104" and p.startswith("iter_0000300/") for r, p in got), got
        assert rep["facts"]["newest_complete"] == "iter_0000100"
    finally:
        srv.stop()
