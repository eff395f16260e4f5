"""The text report off a terminal is written without rich (start-up, issue 20); it must be byte for
byte what rich prints there, for every kind of report the tool makes."""
import io
import subprocess
import sys

from ckptdoctor.report import styled, text


def _both(report) -> tuple[str, str]:
    a, b = io.StringIO(), io.StringIO()
    ORIG(report, a, plain=True)
    ORIG(report, b, plain=False)   # rich, not a terminal: no colour, width 100,000
    return a.getvalue(), b.getvalue()


ORIG = text.render


def test_every_demo_report_renders_the_same_plain_and_with_rich(tmp_path, monkeypatch, capsys):
    """The demo makes a report of every command with a text view (verify run table, checksums,
    reconcile simulation tables, publish, preflight node table, fix, prune, contract).  (Wrapping at
    $COLUMNS and ASCII tables are the plain console's own, tested below: off here.)"""
    monkeypatch.setenv("COLUMNS", "100000")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    seen = []

    def both(report, out, plain=None):
        p, r = _both(report)
        assert p == r, f"{report.command}: plain and rich text differ"
        seen.append((report.command, p))
        out.write(p)

    monkeypatch.setattr(text, "render", both)
    from ckptdoctor.demo import run_demo
    assert run_demo(str(tmp_path / "demo")) == 0
    from ckptdoctor.api import make_engine
    from ckptdoctor.commands import prune
    run = str(tmp_path / "demo" / "megatron-run")
    eng = make_engine("prune", run)
    prune.run(run, eng, keep_last=1, keep_every=None, dry_run=True)
    text.render(eng.report, io.StringIO())
    cmds = {c for c, _ in seen}
    assert {"verify", "reconcile", "publish", "preflight", "prune"} <= cmds, cmds
    assert any("┏" in p for _, p in seen)                      # tables were among them
    assert sum(p.count("\n") for _, p in seen) > 50


def test_awkward_cells_plain_equals_rich():
    t = styled.Table(title="run [bold]x[/bold] 日本", title_justify="left")
    t.add_column("name")
    t.add_column("n", justify="right")
    t.add_column("wide 語")
    t.add_row("step[1]", "7", styled.Text("ok", style="green"))
    t.add_row("ab", "12345", "x\ry\x07z", style="red")   # (a tab in a cell: rich splits the cell)
    t.add_row("two\nlines", "", "日本語")
    lines = [styled.Text("  ").append("error  ", style="bold red").append("[CKD1] message\twith tab"),
             styled.Text(""), "plain str [dim]not markup[/dim]"]
    for obj in [t, *lines]:
        a, b = io.StringIO(), io.StringIO()
        styled.PlainConsole(a, width=100_000, ascii_only=False).print(obj)
        styled.RichConsole(b, width=100_000, no_color=False, force_terminal=None).print(obj)
        assert a.getvalue() == b.getvalue()


def test_colour_forced_still_uses_rich(monkeypatch):
    monkeypatch.setattr(text, "COLOR", "always")
    con = text.console(io.StringIO())
    assert isinstance(con, styled.RichConsole)
    monkeypatch.setattr(text, "COLOR", "auto")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    assert isinstance(text.console(io.StringIO()), styled.PlainConsole)
    monkeypatch.setenv("FORCE_COLOR", "1")              # rich would style: so rich it is
    assert isinstance(text.console(io.StringIO()), styled.RichConsole)
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    assert isinstance(text.console(io.StringIO()), styled.PlainConsole)


def test_verify_to_a_pipe_does_not_import_rich(tmp_path):
    from ckptdoctor.demo import build_run
    build_run(str(tmp_path / "run"))
    code = ("import sys; from ckptdoctor.__main__ import run\n"
            "sys.argv = ['ckptdoctor', 'verify', sys.argv[1]]\n"
            "try:\n    run()\nexcept SystemExit as e:\n    code = e.code\n"
            "sys.stderr.write('RICH=%s' % any(m == 'rich' or m.startswith('rich.') for m in sys.modules))\n"
            "sys.exit(code)")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True)
    assert p.returncode == 1 and "CKD104 shard-truncated" in p.stdout and "┏" in p.stdout
    assert "RICH=False" in p.stderr


def test_logs_get_ascii_tables_and_prose_within_the_width_and_paths_whole(tmp_path):
    """A Slurm log under LC_ALL=C: no box-drawing characters; prose wrapped at $COLUMNS (100 when
    unset); a path is never cut, so only a line that is one path may be wider."""
    from ckptdoctor.demo import build_run
    build_run(str(tmp_path / "r"))
    deep = tmp_path / ("a-very-long-directory-name-" * 4) / "run"
    import shutil
    shutil.copytree(tmp_path / "r", deep)
    for env in ({"LC_ALL": "C", "COLUMNS": "80"}, {"LC_ALL": "", "LANG": "", "LC_CTYPE": ""}):
        full = {k: v for k, v in __import__("os").environ.items() if k not in ("LC_ALL", "LANG", "LC_CTYPE", "COLUMNS")}
        full.update({k: v for k, v in env.items() if v})
        p = subprocess.run([sys.executable, "-m", "ckptdoctor", "verify", str(deep)], capture_output=True, text=True,
                           env=full)
        width = int(env.get("COLUMNS", 100))
        assert p.stdout.isascii(), p.stdout
        for line in p.stdout.splitlines():
            if len(line) > width:
                assert str(deep) in line and len(line.split()) <= 2, line   # a path (with its label) alone
        assert ("+==" in p.stdout) == (width == 100) and any(str(deep) in x for x in p.stdout.splitlines())
        assert "iter_0000300" in p.stdout and "NO: CKD104 shard-truncated" in p.stdout  # rows, as lines when narrow


def test_progress_in_a_log_every_ten_seconds_and_within_the_terminal_width(monkeypatch, capsys):
    """Off a terminal: one plain line per 10 s of work (a Slurm log sees a long --checksums alive,
    not flooded); on a narrow terminal the bar line is cut to its width, so `\\r` redraws it in place."""
    import os as _os
    from ckptdoctor.report import progress as P
    now = [1000.0]
    monkeypatch.setattr(P.time, "monotonic", lambda: now[0])
    p = P.Progress(100 << 20, "hashing x")
    p.tty = False
    for _ in range(10):       # 9.9 s of work in 1.1 s steps... nothing yet
        now[0] += 0.99
        p(1 << 20)
    assert capsys.readouterr().err == ""
    now[0] += 0.2
    p(1 << 20)
    assert capsys.readouterr().err.startswith("ckptdoctor: hashing x: ")
    monkeypatch.setattr(P.shutil if hasattr(P, "shutil") else __import__("shutil"), "get_terminal_size",
                        lambda fallback=(80, 24): _os.terminal_size((50, 24)))
    t = P.Progress(100 << 20, "hashing a-very-long-checkpoint-name-indeed")
    t.tty = True
    now[0] += 1
    t(1 << 20)
    out = capsys.readouterr().err
    assert out.startswith("\r") and out.endswith("\x1b[K") and len(out[1:-3]) <= 49, repr(out)
