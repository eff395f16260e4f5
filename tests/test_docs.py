"""Generated man pages and completions are current, and document every option."""
import subprocess
import sys
from pathlib import Path

import typer

from ckptdoctor.cli import app
from helpers import cli

ROOT = Path(__file__).resolve().parent.parent


def test_generated_files_are_current():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_every_option_of_every_command_is_in_its_man_page():
    cmd = typer.main.get_command(app.build())
    leaves = []
    for name, sub in cmd.commands.items():  # groups (contract, digests): a page per subcommand
        leaves += [(f"{name}-{n}", c) for n, c in sub.commands.items()] if hasattr(sub, "commands") else [(name, sub)]
    assert {"contract-init", "contract-check", "contract-new-phase", "digests-diff"} <= {n for n, _ in leaves}
    for name, sub in leaves:
        text = (ROOT / "man" / f"ckptdoctor-{name}.1").read_text()
        for p in sub.params:
            for opt in p.opts if p.param_type_name == "option" else ():
                assert opt.replace("-", "\\-") in text, (name, opt)
    top = (ROOT / "man" / "ckptdoctor.1").read_text()
    assert ".SH EXIT STATUS" in top and ".SH FILES" in top and "\\fB75\\fR" in top


def test_zsh_and_fish_scripts_are_for_their_shells():
    assert (ROOT / "completions" / "_ckptdoctor").read_text().startswith("#compdef ckptdoctor")
    assert "complete -c ckptdoctor" in (ROOT / "completions" / "ckptdoctor.fish").read_text() or \
        "complete --command ckptdoctor" in (ROOT / "completions" / "ckptdoctor.fish").read_text()
    bash = (ROOT / "completions" / "ckptdoctor.bash").read_text()
    import re
    assert re.search(r"^complete .*-F \S+ ckptdoctor$", bash, re.M), bash[-300:]


def test_runtime_completion_answers():
    rc, out, _ = cli(env={"_CKPTDOCTOR_COMPLETE": "complete_bash", "COMP_WORDS": "ckptdoctor verify --fo",
                          "COMP_CWORD": "2"})
    assert "--format" in out


def test_every_man_page_has_examples():
    for page in sorted((ROOT / "man").glob("*.1")):
        text = page.read_text()
        assert ".SH EXAMPLES" in text and text.index(".SH EXAMPLES") < text.index(".SH EXIT STATUS"), page.name
        assert "ckptdoctor" in text.split(".SH EXAMPLES", 1)[1].split(".SH", 1)[0], page.name


def test_man_page_names_are_whole_true_sentences_and_verify_shows_the_gate_and_fix():
    """`man -k` and whatis show the NAME line alone: it must be a whole sentence (not cut where typer's
    first help line ends), and verify's page shows the relaunch gate and --fix among its examples."""
    import re
    root = Path(__file__).resolve().parent.parent / "man"
    for page in sorted(root.glob("*.1")):
        text = page.read_text()
        name = text.split(".SH NAME\n", 1)[1].split("\n", 1)[0]
        assert re.search(r"[.?]$", name), (page.name, name)
    verify = (root / "ckptdoctor-verify.1").read_text()
    ex = verify.split(".SH EXAMPLES", 1)[1].split(".SH ", 1)[0]
    assert "\\-\\-target resume" in ex and "\\-\\-fix" in ex
    assert "Read\\-only" not in verify.split(".SH NAME\n", 1)[1].split("\n", 1)[0]  # --fix writes


def test_every_exit_code_is_documented_in_the_readme_and_the_man_page():
    """Exit codes are a public contract: each one the code can return is in the README's table
    and in ckptdoctor(1)'s EXIT STATUS, and the tables list no code the code cannot return."""
    import re
    from ckptdoctor.engine.errors import EXIT_CODES
    readme = (ROOT / "README.md").read_text()
    table = {int(m) for m in re.findall(r"^\| (\d+) \|", readme, re.M)}
    assert table == set(EXIT_CODES), (sorted(table), sorted(EXIT_CODES))
    man = (ROOT / "man" / "ckptdoctor.1").read_text()
    status = man.split(".SH EXIT STATUS", 1)[1].split(".SH ", 1)[0]
    listed = {int(m) for m in re.findall(r"^\\fB(\d+)\\fR$", status, re.M)}
    assert listed == set(EXIT_CODES), (sorted(listed), sorted(EXIT_CODES))
