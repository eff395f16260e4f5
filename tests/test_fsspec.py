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
