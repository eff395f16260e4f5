"""The command line declared without importing typer; typer builds it when it is needed.

cli.py writes `typer.Option(...)`, `@app.command(...)`, `raise typer.Exit(n)` as usual, but its
`typer` is this module: each call records what it was given.  `Typer.build()` replays the records
on a real `typer.Typer` (help, errors, completion and the first run of a new version go there),
while `fastcli` parses the everyday invocations from a spec compiled from that same typer build
and calls the same functions, without importing typer or click.

Why: importing typer (with its vendored click) costs ~75 ms of wall time on this project's
machine, four times a bare `python -c pass`; a Slurm prolog, a shell loop over run roots and
scripts pay it on every call (issue 20).
"""
from __future__ import annotations

import functools
import sys


class Exit(SystemExit):
    """`raise typer.Exit(code)` in a command: a SystemExit, so the process ends with `code` whether
    click (standalone mode lets SystemExit through) or the fast path called the command."""

    def __init__(self, code: int = 0):
        super().__init__(code)
        self.exit_code = code


class _Param:
    __slots__ = ("args", "kwargs")
    kind = ""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def real(self):
        import typer
        return getattr(typer, self.kind)(*self.args, **self.kwargs)


class _Option(_Param):
    __slots__ = ()
    kind = "Option"


class _Argument(_Param):
    __slots__ = ()
    kind = "Argument"


def Option(*args, **kwargs) -> _Option:  # noqa: N802 (typer's spelling)
    return _Option(*args, **kwargs)


def Argument(*args, **kwargs) -> _Argument:  # noqa: N802
    return _Argument(*args, **kwargs)


class Typer:
    """Records commands, sub-apps and the callback in declaration order."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.commands: list[tuple[str | None, object, dict]] = []   # (name, function, kwargs)
        self.groups: list[tuple["Typer", dict]] = []
        self.callback_: tuple[object, dict] | None = None
        self._built = None

    def command(self, name: str | None = None, **kwargs):
        def deco(fn):
            self.commands.append((name, fn, kwargs))
            return fn
        return deco

    def callback(self, **kwargs):
        def deco(fn):
            self.callback_ = (fn, kwargs)
            return fn
        return deco

    def add_typer(self, sub: "Typer", **kwargs) -> None:
        self.groups.append((sub, kwargs))

    def functions(self, prefix: tuple[str, ...] = ()):
        """(command path, function) for every command, sub-apps included."""
        for name, fn, _ in self.commands:
            yield (*prefix, name or fn.__name__.replace("_", "-")), fn
        for sub, kw in self.groups:
            yield from sub.functions((*prefix, kw["name"]))

    def __call__(self, *args, **kwargs):
        """`app()` as with typer (scripts and tests that call the app object directly)."""
        return self.build()(*args, **kwargs)

    def build(self):
        """The real typer.Typer (built once per process)."""
        if self._built is None:
            import typer
            t = typer.Typer(**self.kwargs)
            for name, fn, kw in self.commands:
                t.command(name, **kw)(_with_real_defaults(fn))
            if self.callback_:
                fn, kw = self.callback_
                t.callback(**kw)(_with_real_defaults(fn))
            for sub, kw in self.groups:
                t.add_typer(sub.build(), **kw)
            self._built = t
        return self._built


def interrupted() -> SystemExit:
    """Ctrl-C in a command: one line and exit 130, the same on both paths (click alone would print
    "Aborted!" and exit 1, which a gate reads as "findings")."""
    sys.stderr.write("ckptdoctor: interrupted\n")
    return SystemExit(130)


def _with_real_defaults(fn):
    """What typer calls: `fn` under the signature typer expects (typer.Option/Argument defaults),
    with Ctrl-C handled as the fast path handles it.  `fn` itself, which the fast path calls, is
    unchanged; typing.get_type_hints follows __wrapped__ to fn's globals for the annotations."""
    import inspect  # here, not at the top: 12 ms of start-up that only the typer path needs
    sig = inspect.signature(fn)
    params = [p.replace(default=p.default.real()) if isinstance(p.default, _Param) else p
              for p in sig.parameters.values()]

    @functools.wraps(fn)
    def call(**kwargs):
        try:
            return fn(**kwargs)
        except KeyboardInterrupt:
            raise interrupted() from None
    call.__signature__ = sig.replace(parameters=params)
    return call
