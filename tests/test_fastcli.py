"""The fast command-line path (no typer import) accepts only what typer accepts, and hands each
command exactly the arguments typer hands it -- checked for every command of the real CLI on a
generated corpus of valid and invalid command lines."""
import inspect
import os
import subprocess
import sys
import types

import pytest

from ckptdoctor import cli, clidecl, fastcli


def _shadow(app: clidecl.Typer, captured: list) -> clidecl.Typer:
    """The same CLI, every command replaced by a recorder with the same signature and globals."""
    def recorder(fn):
        def _capture(**kwargs):
            captured.append(kwargs)
        rec = types.FunctionType(_capture.__code__, fn.__globals__, fn.__name__, None, _capture.__closure__)
        rec.__annotations__ = dict(fn.__annotations__)
        rec.__signature__ = inspect.signature(fn)
        return rec
    t = clidecl.Typer(**app.kwargs)
    for name, fn, kw in app.commands:
        t.command(name or fn.__name__.replace("_", "-"), **kw)(recorder(fn))
    for sub, kw in app.groups:
        t.add_typer(_shadow(sub, captured), **kw)
    return t


@pytest.fixture(scope="module")
def judge():
    captured: list = []
    shadow = _shadow(cli.app, captured)
    real = shadow.build()
    spec = fastcli.compile_spec(cli.app)

    def typer_says(args):
        """typer's kwargs for `args`, or None when typer refuses them (usage error, help)."""
        captured.clear()
        try:
            real(args=list(args), prog_name="ckptdoctor", standalone_mode=False)
        except Exception:  # click's UsageError and friends
            return None
        except SystemExit:
            return None
        return captured[0] if captured else None

    def fast_says(args):
        key = next((k for k in (" ".join(args[:2]), args[0]) if k in spec["commands"]), None)
        if key is None or "-h" in args or "--help" in args:
            return None
        fn = dict((" ".join(p), f) for p, f in cli.app.functions())[key]
        try:
            return fastcli._bind(spec["commands"][key]["params"], args[len(key.split()):], fn)
        except fastcli._Refuse:
            return None
    return spec, typer_says, fast_says


def _sample(p: dict, good: bool = True, other: bool = False) -> str:
    t = p["type"]
    if t == "choice":
        return p["choices"][0 if other else -1] if good else "no-such-choice"
    if other:
        return {"int": "4", "float": "0.5", "str": "z"}.get(t, "w")
    return {"int": "3" if good else "three", "float": "2.5" if good else "fast",
            "str": "x,y" if good else "-dash"}.get(t, "v")


def _corpus(spec):
    for key, c in spec["commands"].items():
        words = key.split()
        params = c["params"]
        args = [p for p in params if p["param"] == "argument"]
        base = words + [f"arg{i}" for i, _ in enumerate(args)]
        yield base
        yield words                                   # arguments missing (when required)
        yield base + ["extra-positional"]
        yield base + ["--no-such-option"]
        yield base + ["--"]
        yield base + ["-h"]
        opts = [p for p in params if p["param"] == "option"]
        for p in opts:
            o = p["opts"][0]
            if p["flag"]:
                yield base + [o]
                yield [*words, o, *base[len(words):]]           # before the arguments
                yield base + [f"{o}=1"]
                continue
            yield base + [o, _sample(p)]
            yield base + [f"{o}={_sample(p)}"]
            yield base + [o, _sample(p, good=False)]
            yield base + [o]                                     # value missing
            if p["multiple"]:
                yield base + [o, "a", o, "b"]
            else:
                yield base + [o, _sample(p), o, _sample(p, other=True)]      # the last one wins
            for short in [s for s in p["opts"] if not s.startswith("--")]:
                yield base + [short, _sample(p)]
        flags = [p["opts"][-1] for p in opts if p["flag"] and len(p["opts"][-1]) == 2]
        if len(flags) >= 2:
            yield base + ["-" + flags[0][1] + flags[1][1]]       # bundled short flags: typer's job


def test_fast_path_agrees_with_typer_on_every_command(judge):
    spec, typer_says, fast_says = judge
    assert {"verify", "publish", "preflight", "reconcile", "contract check", "digests diff"} <= set(spec["commands"])
    accepted = refused = 0
    for argv in _corpus(spec):
        want, got = typer_says(argv), fast_says(argv)
        if got is None:
            refused += 1
            continue                                  # typer decides: always safe
        accepted += 1
        assert want is not None, f"fast path accepted what typer refuses: {argv}"
        assert got == want, f"{argv}: fast {got} != typer {want}"
        assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in want.items()}, argv
    assert accepted > 200 and refused > 100, (accepted, refused)   # the corpus exercises both ways


def test_everyday_verify_runs_without_typer_and_help_still_works(tmp_path):
    from ckptdoctor.demo import build_run
    build_run(str(tmp_path / "run"))
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}
    env.pop("CKPTDOCTOR_CACHE_DIR", None)
    probe = ("import sys; from ckptdoctor.__main__ import run\n"
             "try:\n    run()\nexcept SystemExit as e:\n    code = e.code\n"
             "sys.stderr.write('TYPER=%s' % any(m.split('.')[0] == 'typer' for m in sys.modules))\n"
             "sys.exit(code)")

    def ckd(*args):
        return subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, env=env)
    first = ckd("verify", "--format", "json", str(tmp_path / "run"))   # the shipped spec: no typer, ever
    assert first.returncode == 1 and "TYPER=False" in first.stderr
    again = ckd("verify", "--format", "json", str(tmp_path / "run"))
    assert again.returncode == 1 and "TYPER=False" in again.stderr
    import json
    a, b = json.loads(first.stdout), json.loads(again.stdout)
    assert a["findings"] == b["findings"] and a["summary"] == b["summary"] and a["findings"]
    bad = ckd("verify", "--formt", "json", str(tmp_path / "run"))      # a typo: typer's own message
    assert bad.returncode == 2 and "No such option: --formt" in bad.stderr and "TYPER=True" in bad.stderr
    helped = ckd("verify", "--help")
    assert helped.returncode == 0 and "--checksums" in helped.stdout
    missing = ckd("verify")
    assert missing.returncode == 2 and "Missing argument" in missing.stderr
    assert not list(home.rglob("*")), "a command wrote under the user's home"


def test_a_changed_cli_is_never_parsed_from_a_stale_spec(tmp_path, monkeypatch):
    """The shipped spec carries the hash of the files that declare the CLI: after an edit in a checkout
    (or any other difference) every command line goes to typer."""
    from ckptdoctor import cli
    assert fastcli.parse(["verify", "x"], cli.app) is not None
    monkeypatch.setattr(fastcli, "source_hash", lambda: "edited")
    assert fastcli.parse(["verify", "x"], cli.app) is None


def test_a_reinstalled_typer_changes_nothing(tmp_path, monkeypatch):
    """The spec no longer depends on typer's file (a reinstall of typer left every later run on
    typer's path when it did): after `touch`ing typer, a plain command still never imports it."""
    import subprocess
    import sys
    import typer
    os.utime(typer.__file__)
    probe = ("import sys; from ckptdoctor.__main__ import run\n"
             "try:\n    run()\nexcept SystemExit:\n    pass\n"
             "sys.stderr.write('TYPER=%s' % any(m.split('.')[0] == 'typer' for m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe, "verify", str(tmp_path)], capture_output=True, text=True)
    assert "TYPER=False" in out.stderr, out.stderr


@pytest.mark.parametrize("fast", [True, False])
def test_ctrl_c_is_exit_130_on_both_paths(tmp_path, monkeypatch, capsys, fast):
    """Interrupting verify: one line and 130 whether the fast path or typer called the command (not
    click's "Aborted!" and 1, which a relaunch gate would read as findings)."""
    if not fast:
        monkeypatch.setattr(fastcli, "source_hash", lambda: "edited")   # the shipped spec is not used
    from ckptdoctor.commands import verify as flow

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(flow, "run", interrupted)
    monkeypatch.setattr(fastcli, "run_typer", lambda app, args, real=fastcli.run_typer: (
        calls.append("typer"), real(app, args)))
    calls: list = []
    with pytest.raises(SystemExit) as exc:
        cli.main(["verify", str(tmp_path)])
    assert exc.value.code == 130 and "ckptdoctor: interrupted" in capsys.readouterr().err
    assert calls == ([] if fast else ["typer"])
