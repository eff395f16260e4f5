import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("LANG", "C.UTF-8")


@pytest.fixture(autouse=True)
def _reports_never_wrap(monkeypatch):
    """Text reports off a terminal wrap prose at $COLUMNS (100 when unset).  Tests read messages as
    text, so each runs with a width that never wraps (set per test, so pytest's own output keeps its
    width); the wrapping and ASCII output are tested on their own (test_report_text.py)."""
    monkeypatch.setenv("COLUMNS", "100000")

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except Exception:  # pragma: no cover
    HAVE_TORCH = False

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch==2.13.0 (CPU) not installed")


def _run_script(script: str, *args, timeout=300):
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(HERE / "fixtures" / script), *map(str, args)],
                       capture_output=True, text=True, env=env, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{script} failed:\n{p.stdout}\n{p.stderr}")
    return p.stdout


@pytest.fixture(scope="session")
def fixture_root(tmp_path_factory):
    """Real checkpoints made once per session by real torch (DCP single + 4-rank gloo)."""
    if not HAVE_TORCH:
        pytest.skip("torch not installed")
    root = tmp_path_factory.mktemp("real")
    _run_script("make_dcp.py", root)
    return root


@pytest.fixture
def real(fixture_root, tmp_path):
    """A private copy of the session fixtures for tests that break things (preserving mtimes)."""
    def copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(fixture_root / name, dst, copy_function=shutil.copy2)
        return dst
    return copy


@pytest.fixture(scope="session")
def s3_server():
    """One real S3-compatible server (moto's, on loopback) for the whole test run: (url, env)."""
    moto_server = pytest.importorskip("moto.server")
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    srv.start()
    host, port = srv.get_host_and_port()
    url = f"http://{host}:{port}"
    env = {"FSSPEC_S3_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
           "AWS_DEFAULT_REGION": "us-east-1"}
    yield url, env
    srv.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The session's S3 server with its endpoint in this test's environment and a fresh bucket
    (moto keeps state for the whole run): (env, fs, bucket)."""
    import uuid
    import fsspec
    url, env = s3_server
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": url})  # read at import otherwise
    fs = fsspec.filesystem("s3", endpoint_url=url, skip_instance_cache=True)
    bucket = f"ckpts-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    return env, fs, bucket


def pytest_addoption(parser):
    parser.addoption("--fuzz", action="store_true", default=False,
                     help="run the hypothesis fuzzers with the long profile (20,000 examples each)")


_SLOW_MODULES = {"test_slurm", "test_sftp", "test_experts"}


def pytest_collection_modifyitems(config, items):
    """Markers for a quick inner loop (`bash scripts/test.sh -m "not slow"`): `torch` where a test
    builds checkpoints with torch, `slurm` for the real cluster, `slow` for multi-process, cluster,
    S3-server and kill-at-random-moments tests.  CI runs everything."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        mod = item.module.__name__ if item.module else ""
        if names & {"fixture_root", "real"} or mod in ("test_verify_dcp", "test_megatron", "test_experts"):
            item.add_marker(pytest.mark.torch)
        if mod == "test_slurm":
            item.add_marker(pytest.mark.slurm)
        if mod in _SLOW_MODULES or names & {"s3", "s3_server", "fixture_root"} or "kill" in item.name:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: a worker's rules seen firing join this process's (the coverage
    check below runs here, over every worker's tests)."""
    from helpers import FIRED
    FIRED.update(getattr(node, "workeroutput", {}).get("ckd_fired", ()))


def pytest_sessionfinish(session, exitstatus):
    """On a full, green run: every catalog rule must have been seen firing by a test (helpers.FIRED)."""
    cfg = session.config
    if hasattr(cfg, "workerinput"):  # an xdist worker saw only its share: hand it to the controller
        from helpers import FIRED
        cfg.workeroutput["ckd_fired"] = sorted(FIRED)
        return
    narrowed = cfg.getoption("keyword") or cfg.getoption("markexpr") or cfg.getoption("lf", False) or \
        any(a not in ("tests", "tests/", str(HERE)) for a in cfg.args)
    if narrowed or exitstatus != 0 or cfg.getoption("collectonly") or session.testscollected < 100:
        return
    from ckptdoctor.engine.catalog import catalog
    from helpers import FIRED
    missing = sorted(set(catalog()) - FIRED)
    if missing:
        print(f"\nFAILED catalog coverage: no test made these rules fire (assert_fires): {missing}")
        session.exitstatus = 1


def pytest_configure(config):
    if config.getoption("--fuzz"):
        os.environ["CKPTDOCTOR_FUZZ"] = "1"
