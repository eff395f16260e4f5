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


def readme_install_lines() -> list[str]:
    """The README's site-install commands, as written (the block after the `site-install` marker)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- site-install", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The README's install, run literally in a copy of the clone (its /opt/ckptdoctor moved into a
    temporary directory; `python3` is this test's interpreter)."""
    base = tmp_path_factory.mktemp("install")
    src = base / "src"  # a copy of the tracked files: what a clone holds
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True).stdout.decode()
    for rel in filter(None, files.split("\0")):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    prefix = base / "opt" / "ckptdoctor"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    lines = readme_install_lines()
    assert lines and any("pip install" in x for x in lines), lines
    for line in lines:
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", line.replace("/opt/ckptdoctor", str(prefix))],
                           cwd=src, env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, (line, p.stdout[-2000:], p.stderr[-2000:])
    assert list((src / "dist").glob("ckptdoctor-*.whl")), "the README's build line must leave the wheel in dist/"
    return prefix


def test_the_source_distribution_builds(tmp_path):
    p = subprocess.run([sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path), str(ROOT)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and list(tmp_path.glob("ckptdoctor-*.tar.gz")), p.stdout[-2000:] + p.stderr[-2000:]


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
    assert p.returncode == 0 and all(v["exists"] for v in doc.values()), doc
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


def test_paths_fails_when_the_install_lost_its_data_files(installed, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(installed, broken, symlinks=True)
    shutil.rmtree(broken / "share" / "ckptdoctor")
    p = _run(broken, str(broken / "bin" / "python"), "-m", "ckptdoctor", "paths")
    assert p.returncode == 1 and "(not found)" in p.stdout and "reinstall" in p.stderr, (p.stdout, p.stderr)


def test_paths_activate_enables_completion_in_a_fresh_interactive_bash(installed):
    """bash-completion does not search a venv's share/: the documented eval line makes `complete -p`
    know ckptdoctor in a new interactive shell."""
    script = 'eval "$(ckptdoctor paths --activate bash)" && complete -p ckptdoctor'
    p = _run(installed, "bash", "--norc", "-i", "-c", script)
    assert p.returncode == 0 and "ckptdoctor" in p.stdout and "-F" in p.stdout, (p.stdout, p.stderr)
    p = _run(installed, "ckptdoctor", "paths", "--activate", "zsh")
    assert p.returncode == 0 and str(installed / "share" / "zsh" / "site-functions") in p.stdout


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
    assert names == ["preflight-step.sh", "prolog-lib.sh", "prolog-slurmctld.sh", "prolog-wrapper.sh"]
    for n in names:
        assert _run(installed, "bash", "-n", str(d / n)).returncode == 0, n
