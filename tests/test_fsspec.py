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


def test_on_s3_the_gate_sizes_files_from_listings_without_a_head(tmp_path, s3):
    """Issue 42: on an object store the relaunch gate lists the run root and the checkpoint it
    resumes from once each, in pages of 1,000 keys (an older checkpoint not at all), takes every
    size from the listing (no HEAD at all: not for a file, not to ask whether the run root exists
    before listing it) and GETs only the small files it parses. Counted by the
    latency harness's proxy (benchmarks/latency/s3proxy.py) in front of a real S3 server."""
    import json
    import math
    import os
    import sys
    from helpers import cli
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "latency"))
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    from latency_bench import build_run_root
    from s3proxy import S3Proxy
    env, fs, bucket = s3
    files = build_run_root(str(tmp_path / "run"), 2, 1000)   # 1,002 keys per checkpoint: two pages each
    fs.put(str(tmp_path / "run"), f"{bucket}/run", recursive=True)
    proxy = S3Proxy(env["FSSPEC_S3_ENDPOINT_URL"], 0.0).start()
    try:
        rc, out, err = cli("verify", "--target", "resume", "--format", "json", f"s3://{bucket}/run",
                           env={**env, "FSSPEC_S3_ENDPOINT_URL": proxy.url})
        ops = proxy.stats()["ops"]
    finally:
        proxy.stop()
    assert rc == 0 and json.loads(out)["facts"]["gate"]["passed"], err
    per_dir = math.ceil(1002 / 1000)
    assert files == 2 * 1002 + 1 and ops.get("HEAD", 0) == 0 and ops["LIST"] == 1 + per_dir, ops
    assert ops["GET"] <= 2 + 1, ops   # the target's .metadata and metadata.json, the tracker


def test_a_url_that_is_missing_or_a_single_object_is_a_one_line_error_and_an_empty_prefix_no_checkpoint():
    """Listing an object store's location first (issue 42) keeps what a user is told: a prefix
    with nothing under it and no directory object is "no such file or directory", an object is
    "not a directory", an empty directory is judged (no checkpoint there: CKD902)."""
    import fsspec
    import pytest
    from ckptdoctor.engine.errors import InputError
    fs = fsspec.filesystem("memory")
    fs.pipe("memory://urls/run/file.bin", b"x")
    fs.mkdir("memory://urls/empty")
    with pytest.raises(InputError, match=r"^memory://urls/nothere: no such file or directory$"):
        api.verify("memory://urls/nothere")
    with pytest.raises(InputError, match=r"^memory://urls/run/file.bin: not a directory \(give"):
        api.verify("memory://urls/run/file.bin")
    assert_fires(api.verify("memory://urls/empty"), "CKD902", severity="error")
