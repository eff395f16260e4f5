import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

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


def pytest_addoption(parser):
    parser.addoption("--fuzz", action="store_true", default=False,
                     help="run the hypothesis fuzzers with the long profile (20,000 examples each)")


def pytest_configure(config):
    if config.getoption("--fuzz"):
        os.environ["CKPTDOCTOR_FUZZ"] = "1"
