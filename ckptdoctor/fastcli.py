"""Parse an everyday command line without importing typer or click (issue 20: start-up).

typer stays the definition and the judge.  At build time (`scripts/gen_docs.py`) the click commands
typer builds are compiled into a spec of every command's parameters (option names, flags, value
types, choices, defaults, how typer converts them), shipped as `ckptdoctor/_cli_spec.json` with a
hash of the files that declare the CLI; a run uses it only when those files still hash the same (an
edit in a checkout without regenerating sends every command line to typer; tests/test_docs.py fails
on it), and writes nothing anywhere (issue 38: the spec cached in the user's home went stale after a
reinstall of typer and grew by a file per checkout).  Runs parse from the spec when the
command line is plainly valid: known options with well-formed values, the right number of
arguments.  Anything else (help, a typo, a bad value, a missing argument, `--`, bundled short
flags, completion) goes to typer, which prints exactly what it always printed.  So the fast path
only ever accepts a command line typer would accept, and passes the command the same arguments:
tests/test_fastcli.py compares the two on a corpus of command lines.
"""
from __future__ import annotations

import json
import os

SPEC_VERSION = 2  # 2: a parameter typed with an Enum names it ("enum"), so parsing needs no typing


class Call:
    """The command function and the arguments typer would have passed it."""
    __slots__ = ("fn", "kwargs")

    def __init__(self, fn, kwargs: dict):
        self.fn, self.kwargs = fn, kwargs


ARTEFACT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cli_spec.json")


def _key_files() -> list[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, "cli.py"), os.path.join(here, "clidecl.py"), __file__]


def source_hash() -> str:
    """The files that declare the CLI, hashed (~45 KB: well under a millisecond)."""
    import xxhash
    h = xxhash.xxh3_128()
    for f in _key_files():
        with open(f, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


def _load_spec() -> dict | None:
    try:
        with open(ARTEFACT, "rb") as fh:
            spec = json.loads(fh.read())
        if not (isinstance(spec, dict) and spec.get("version") == SPEC_VERSION):
            return None
        return spec if spec.get("source") == source_hash() else None
    except (OSError, ValueError, TypeError, RecursionError):
        return None


# ---- compiling the spec from typer's click commands ------------------------------------------------
def compile_spec(app) -> dict:
    """{"version", "commands": {"verify": {...}, "contract check": {...}}} from the real click
    commands typer builds for `app` (a clidecl.Typer).  Read by duck type and type name, so a
    typer that vendors click (0.27/0.28) and one that imports it compile alike."""
    import typer

    group = typer.main.get_command(app.build())
    fns = {" ".join(path): fn for path, fn in app.functions()}
    out: dict = {}

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if isinstance(subs, dict):
            for name, sub in subs.items():
                walk(sub, (*path, name))
            return
        key = " ".join(path)
        if key in fns:
            enums = _enum_params(fns[key])
            out[key] = {"function": fns[key].__name__, "params": [_param(p, enums) for p in cmd.params]}

    walk(group, ())
    return {"version": SPEC_VERSION, "source": source_hash(), "commands": out}


_KINDS = {"StringParamType": "str", "IntParamType": "int", "FloatParamType": "float", "BoolParamType": "bool"}


def _enum_params(fn) -> dict[str, str]:
    """{parameter: Enum class name in fn's module} for parameters typed with an Enum (or an optional
    one): typer hands those functions the member, not the string."""
    import enum
    import typing
    out = {}
    for name, t in typing.get_type_hints(fn).items():
        args = typing.get_args(t)
        if args and type(None) in args:   # X | None
            t = next(a for a in args if a is not type(None))
        if isinstance(t, type) and issubclass(t, enum.Enum) and fn.__globals__.get(t.__name__) is t:
            out[name] = t.__name__
    return out


def _param(p, enums: dict[str, str]) -> dict:
    t = p.type
    kind = "choice" if hasattr(t, "choices") else _KINDS.get(type(t).__name__, "other:" + type(t).__name__)
    is_option = hasattr(p, "is_flag")
    d = {"name": p.name, "param": "option" if is_option else "argument", "type": kind,
         "nargs": p.nargs, "multiple": bool(getattr(p, "multiple", False)), "required": bool(p.required),
         "default": _jsonable(p.default), "has_default": p.default is not None}
    if kind == "choice":
        d["choices"] = [str(getattr(c, "value", c)) for c in t.choices]
    if p.name in enums:
        d["enum"] = enums[p.name]
    if is_option:
        d.update(opts=list(p.opts), secondary=list(p.secondary_opts), flag=bool(p.is_flag),
                 count=bool(getattr(p, "count", False)), callback=p.callback is not None,
                 envvar=bool(p.envvar))
    return d


def _jsonable(v):
    if hasattr(v, "value") and not isinstance(v, (str, int, float, bool)):  # an Enum member
        return v.value
    if isinstance(v, tuple):
        return list(v)
    return v


def run_typer(app, args: list[str]) -> None:
    """The typer path (help, errors, anything the spec does not cover)."""
    app.build()(args=args, prog_name="ckptdoctor", standalone_mode=True)


# ---- the fast parse ----------------------------------------------------------------------------------
class _Refuse(Exception):
    """Not plainly valid: let typer parse it (and say what is wrong)."""


def parse(args: list[str], app) -> Call | None:
    """A Call when `args` is an everyday command line the spec covers; None sends it to typer."""
    if not args or args[0].startswith("-") or "-h" in args or "--help" in args:
        return None
    spec = _load_spec()
    if spec is None:
        return None
    cmds = spec["commands"]
    if len(args) >= 2 and f"{args[0]} {args[1]}" in cmds:
        key, rest = f"{args[0]} {args[1]}", args[2:]
    elif args[0] in cmds:
        key, rest = args[0], args[1:]
    else:
        return None
    fns = {" ".join(p): f for p, f in app.functions()}
    fn = fns.get(key)
    if fn is None or fn.__name__ != cmds[key]["function"]:
        return None
    try:
        kwargs = _bind(cmds[key]["params"], rest, fn)
    except _Refuse:
        return None
    return Call(fn, kwargs)


def _bind(params: list[dict], rest: list[str], fn) -> dict:
    opts: dict[str, tuple[dict, bool]] = {}
    for p in params:
        if p["param"] == "option":
            if p.get("envvar"):
                raise _Refuse()           # click would read the environment; leave that to it
            if p.get("count") or p.get("callback") or p["nargs"] != 1 or p["type"].startswith("other:"):
                if any(o in rest or any(a.startswith(o + "=") for a in rest) for o in p["opts"] + p["secondary"]):
                    raise _Refuse()
            for o in p["opts"]:
                opts[o] = (p, True)
            for o in p["secondary"]:
                opts[o] = (p, False)
    got: dict[str, list] = {}
    positional: list[str] = []
    i = 0
    while i < len(rest):
        a = rest[i]
        i += 1
        if a == "--" or (a.startswith("-") and a != "-"):
            if a == "--":
                raise _Refuse()
            name, eq, val = a.partition("=") if a.startswith("--") else (a, "", "")
            if name not in opts:
                raise _Refuse()
            p, positive = opts[name]
            if p["flag"]:
                if eq:
                    raise _Refuse()
                got.setdefault(p["name"], []).append(positive)
                continue
            if not eq:
                if i >= len(rest) or rest[i].startswith("-"):
                    raise _Refuse()       # a missing value, or one that looks like an option
                val = rest[i]
                i += 1
            got.setdefault(p["name"], []).append(_value(p, val))
        else:
            positional.append(a)
    out: dict = {}
    for p in params:
        if p["param"] != "argument":
            continue
        if p["nargs"] == -1:
            vals = [_value(p, v) for v in positional]
            positional = []
            if not vals and p["required"]:
                raise _Refuse()
            out[p["name"]] = vals if vals else (None if not p["has_default"] else list(p["default"] or []))
        else:
            if positional:
                out[p["name"]] = _value(p, positional.pop(0))
            elif p["required"]:
                raise _Refuse()
            else:
                out[p["name"]] = p["default"]
    if positional:
        raise _Refuse()
    for p in params:
        if p["param"] != "option":
            continue
        vals = got.get(p["name"])
        if p["multiple"]:
            out[p["name"]] = vals if vals else (None if not p["has_default"] else list(p["default"]))
        elif vals:
            out[p["name"]] = vals[-1]
        elif p["required"]:
            raise _Refuse()
        else:
            out[p["name"]] = p["default"] if not p["flag"] else bool(p["default"])
    return _convert(out, params, fn)


def _value(p: dict, v: str):
    t = p["type"]
    if t == "str":
        return v
    if t == "choice":
        if v not in p["choices"]:
            raise _Refuse()
        return v
    try:
        if t == "int":
            return int(v)
        if t == "float" and float(v) == float(v):   # NaN (never equal to itself): click's call
            return float(v)
    except ValueError:
        raise _Refuse() from None
    raise _Refuse()


def _convert(values: dict, params: list[dict], fn) -> dict:
    """What typer hands the function: Enum members for parameters the spec says are Enum-typed;
    lists for repeatable options (None when not given and without a default)."""
    out = dict(values)
    for p in params:
        name = p.get("enum")
        if name and out.get(p["name"]) is not None:
            cls = fn.__globals__.get(name)
            if cls is None:
                raise _Refuse()  # the function's module changed under the spec: typer parses it
            out[p["name"]] = cls(out[p["name"]])
    return out
