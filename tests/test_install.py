"""The package as a site installs it: build the sdist and wheel, install the wheel into a fresh venv
(no clone, no torch), and check from outside what an admin relies on: the CLI and its demo, the
man pages under share/man, the bash completion in a real interactive bash, and the Slurm scripts."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("install")
    dist = base / "dist"
    src = base / "src"  # build from a copy of the tracked files: what a clone holds
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True).stdout.decode()
    for rel in filter(None, files.split("\0")):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    p = subprocess.run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(dist), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    wheels = list(dist.glob("ckptdoctor-*.whl"))
    assert wheels and list(dist.glob("ckptdoctor-*.tar.gz"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    p = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        str(wheels[0])], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return venv


def _run(venv, *args, **kw):
    env = dict(os.environ, PATH=f"{venv / 'bin'}:{os.environ['PATH']}")
    env.pop("PYTHONPATH", None)
    return subprocess.run(list(args), capture_output=True, text=True, env=env, cwd=venv.parent, timeout=300, **kw)


def test_cli_and_demo_work_without_torch(installed):
    assert _run(installed, str(installed / "bin" / "python"), "-c", "import torch").returncode != 0
    p = _run(installed, "ckptdoctor", "--version")
    assert p.returncode == 0 and p.stdout.startswith("ckptdoctor ")
    p = _run(installed, "ckptdoctor", "demo", str(installed.parent / "demo"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "framework will resume from" in p.stdout


def test_paths_name_the_installed_files(installed):
    import json
    p = _run(installed, "ckptdoctor", "paths", "-f", "json")
    doc = json.loads(p.stdout)
    assert all(v["exists"] for v in doc.values()), doc
    assert doc["man"]["path"] == str(installed / "share" / "man" / "man1")
    assert doc["slurm"]["path"] == str(installed / "share" / "ckptdoctor" / "slurm")


def test_man_page_renders(installed):
    page = installed / "share" / "man" / "man1" / "ckptdoctor-verify.1"
    p = subprocess.run(["man", "-l", str(page)], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, MANPAGER="cat", PAGER="cat", MANWIDTH="100"))
    assert p.returncode == 0 and "--checksums" in p.stdout and "EXAMPLES" in p.stdout.upper(), p.stderr
    # and found by name through the prefix's man directory
    p = subprocess.run(["man", "-w", "ckptdoctor"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, MANPATH=str(installed / "share" / "man")))
    assert p.returncode == 0 and p.stdout.strip() == str(installed / "share" / "man" / "man1" / "ckptdoctor.1")


def test_bash_completion_in_a_real_interactive_bash(installed):
    comp = installed / "share" / "bash-completion" / "completions" / "ckptdoctor"
    script = (f"source {comp}\n"
              "COMP_WORDS=(ckptdoctor ver); COMP_CWORD=1\n"
              "_ckptdoctor_completion ckptdoctor ver ckptdoctor\n"
              "printf '%s\\n' \"${COMPREPLY[@]}\"\n"
              "COMP_WORDS=(ckptdoctor verify --chec); COMP_CWORD=2\n"
              "_ckptdoctor_completion ckptdoctor --chec verify\n"
              "printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    p = _run(installed, "bash", "--norc", "-i", "-c", script)
    words = p.stdout.split()
    assert "verify" in words and "--checksums" in words, (p.stdout, p.stderr)


def test_slurm_scripts_are_installed_and_parse(installed):
    d = installed / "share" / "ckptdoctor" / "slurm"
    names = sorted(x.name for x in d.iterdir())
    assert names == ["preflight-step.sh", "prolog-slurmctld.sh", "prolog-wrapper.sh"]
    for n in names:
        assert _run(installed, "bash", "-n", str(d / n)).returncode == 0, n
