"""Typed values: the part of `dataclasses` this project uses, with the same behaviour and spelling
(`@value(frozen=True)`, `field(default_factory=list)`), at a fraction of its start-up cost.

Why not `dataclasses` itself (issue 20: `verify` of a small checkpoint must start within 6x a bare
interpreter): measured on this project's VM, `import dataclasses` costs 20-26 ms because it imports
`inspect` (and with it `ast`, `dis`, `tokenize`), and building the 28 value classes a structural
verify imports costs 34 ms, most of it compiling the generated methods. Here nothing else is
imported, and the compiled methods are cached by their source text (see _compiled). Together with
keeping `typing` and `inspect` off the path: `verify <small DCP>` 6.8x -> 4.5x `python -c pass`
(benchmarks/README.md, session 9).

Supported, as dataclasses does it: `frozen`, `eq`, `order`, `slots`, `kw_only`; `field(default=,
default_factory=, repr=)`; inherited fields (bases first, in definition order); `__post_init__`;
`__match_args__`; the hash rules (frozen and eq: hashed by the fields; eq alone: unhashable; a
`__hash__` in the class body is kept). Methods the class body defines are kept. Not supported, and
refused rather than half-done: ClassVar/InitVar annotations, a mutable default (list, dict, set).
`fields_of(cls)` gives the fields in order. tests/test_values.py compares each feature with
`dataclasses` itself.
"""
from __future__ import annotations

import sys

_MISSING = object()
_CODE: dict | None = None   # generated source -> its compiled code, from the cache file
_USED: set[str] = set()
_CACHE_MAX = 2000           # entries; past it, a save keeps only what this process used


def _cache_file() -> str:
    import os
    from .engine.yamlcache import _cache_dir
    return os.path.join(_cache_dir(), f"values-{sys.implementation.cache_tag}.marshal")


def _compiled(src: str):
    """The code of a class's generated methods.  Compiling them is most of what building the classes
    costs (the 28 a structural verify imports, under load: 44 ms compiled, 20-22 ms cached), so they are
    kept in the user's cache directory, keyed by the generated source text itself: a class whose
    fields changed generates other text and is compiled afresh; nothing can go stale.  A missing,
    unreadable or damaged cache only means compiling, as without one; it is written once per
    process that compiled something, atomically, and never read past 8 MiB."""
    global _CODE
    if _CODE is None:
        _CODE = {}
        try:
            import marshal
            with open(_cache_file(), "rb") as fh:
                got = marshal.loads(fh.read(8 << 20))
            if isinstance(got, dict):
                _CODE = got
        except Exception:  # noqa: BLE001 - absent, unreadable, damaged or from another build: compile
            _CODE = {}
    _USED.add(src)
    code = _CODE.get(src)
    if type(code) is not _CODE_TYPE:
        code = _CODE[src] = compile(src, "<ckptdoctor.values>", "exec")
        if not _SAVE:  # write the cache once, when this process ends
            import atexit
            _SAVE.append(True)
            atexit.register(_save)
    return code


_SAVE: list[bool] = []
_CODE_TYPE = type(_cache_file.__code__)


def _save() -> None:
    import marshal
    import os
    try:
        keep = _CODE if _CODE is not None and len(_CODE) <= _CACHE_MAX else {k: _CODE[k] for k in _USED}
        path = _cache_file()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(marshal.dumps(keep))
        os.replace(tmp, path)
    except Exception:  # noqa: BLE001 - a read-only home: compile every time, as without a cache
        pass


class FrozenInstanceError(AttributeError):
    """Assigning to a field of a frozen value (the same base class as dataclasses' own)."""


class Field:
    __slots__ = ("name", "default", "default_factory", "repr", "kw_only")

    def __init__(self, default=_MISSING, default_factory=_MISSING, repr: bool = True):
        if default is not _MISSING and default_factory is not _MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name, self.default, self.default_factory, self.repr = "", default, default_factory, repr
        self.kw_only = False

    def __repr__(self) -> str:
        return f"Field(name={self.name!r})"


def field(*, default=_MISSING, default_factory=_MISSING, repr: bool = True):
    return Field(default, default_factory, repr)


def fields_of(cls) -> tuple[Field, ...]:
    return tuple(cls.__value_fields__.values())


def value(cls=None, /, *, frozen: bool = False, eq: bool = True, order: bool = False, slots: bool = False,
          kw_only: bool = False):
    def wrap(c):
        return _process(c, frozen, eq, order, slots, kw_only)
    return wrap if cls is None else wrap(cls)


def _own_fields(cls, kw_only: bool) -> list[Field]:
    out = []
    for name, ann in cls.__dict__.get("__annotations__", {}).items():
        text = ann if isinstance(ann, str) else getattr(ann, "__name__", "")
        if text.split("[", 1)[0].rsplit(".", 1)[-1] in ("ClassVar", "InitVar"):
            raise TypeError(f"{cls.__qualname__}.{name}: ClassVar and InitVar are not supported by values.value")
        default = cls.__dict__.get(name, _MISSING)
        f = default if isinstance(default, Field) else Field(default)
        if isinstance(f.default, (list, dict, set)):
            raise ValueError(f"mutable default {type(f.default).__name__} for field {name} is not allowed: "
                             f"use default_factory")
        f.name, f.kw_only = name, kw_only
        out.append(f)
    return out


def _process(cls, frozen, eq, order, slots, kw_only):
    fields: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        fields.update(getattr(base, "__value_fields__", {}))
    for f in _own_fields(cls, kw_only):
        fields[f.name] = f
    body = dict(cls.__dict__)
    for f in fields.values():  # a Field object never stays a class attribute; a plain default does
        if isinstance(body.get(f.name), Field):
            del body[f.name]
            if not slots:
                if f.default is _MISSING:
                    delattr(cls, f.name)
                else:
                    setattr(cls, f.name, f.default)
    if slots:
        own = [n for n in fields if n in cls.__dict__.get("__annotations__", {})]
        for n in (*own, "__dict__", "__weakref__"):
            body.pop(n, None)
        body["__slots__"] = tuple(own)
        cls = type(cls)(cls.__name__, cls.__bases__, body)
    cls.__value_fields__ = fields

    ns: dict = {"_MISSING": _MISSING, "_set": object.__setattr__, "_Frozen": FrozenInstanceError, "_cls": cls}
    src: list[str] = []
    pos = [f for f in fields.values() if not f.kw_only]
    kws = [f for f in fields.values() if f.kw_only]
    seen_default = False
    params = []
    for f in pos:
        has = f.default is not _MISSING or f.default_factory is not _MISSING
        if seen_default and not has:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
        seen_default = seen_default or has
    for f in pos + kws:
        if f.default is not _MISSING:
            ns[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
        elif f.default_factory is not _MISSING:
            ns[f"_f_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_MISSING")
        else:
            params.append(f.name)
    if kws:
        params.insert(len(pos), "*")
    lines = []
    for f in fields.values():
        val = f"_f_{f.name}() if {f.name} is _MISSING else {f.name}" if f.default_factory is not _MISSING else f.name
        lines.append(f"  _set(self, {f.name!r}, {val})" if frozen else f"  self.{f.name} = {val}")
    if hasattr(cls, "__post_init__"):
        lines.append("  self.__post_init__()")
    src.append(f"def __init__(self, {', '.join(params)}):\n" + ("\n".join(lines) or "  pass"))
    shown = [f.name for f in fields.values() if f.repr]
    src.append("def __repr__(self):\n  return self.__class__.__qualname__ + f'(" +
               ", ".join(f"{n}={{self.{n}!r}}" for n in shown) + ")'")
    tup = "(" + "".join(f"self.{n}," for n in fields) + ")"
    other = "(" + "".join(f"other.{n}," for n in fields) + ")"
    if eq:
        src.append(f"def __eq__(self, other):\n  if other.__class__ is self.__class__:\n"
                   f"    return {tup} == {other}\n  return NotImplemented")
    if order:
        for name, op in (("__lt__", "<"), ("__le__", "<="), ("__gt__", ">"), ("__ge__", ">=")):
            if name in body:
                raise TypeError(f"cannot overwrite attribute {name} in class {cls.__name__}")
            src.append(f"def {name}(self, other):\n  if other.__class__ is self.__class__:\n"
                       f"    return {tup} {op} {other}\n  return NotImplemented")
    if eq and frozen:
        src.append(f"def __hash__(self):\n  return hash({tup})")
    if frozen:
        names = tuple(fields)
        ns["_names"] = names
        src.append("def __setattr__(self, name, value):\n  if type(self) is _cls or name in _names:\n"
                   "    raise _Frozen(f'cannot assign to field {name!r}')\n  super(_cls, self).__setattr__(name, value)")
        src.append("def __delattr__(self, name):\n  if type(self) is _cls or name in _names:\n"
                   "    raise _Frozen(f'cannot delete field {name!r}')\n  super(_cls, self).__delattr__(name)")
    exec(_compiled("\n".join(src)), ns)  # noqa: S102 - the source is built above from the field names
    for name in ("__init__", "__repr__", "__eq__", "__lt__", "__le__", "__gt__", "__ge__", "__setattr__",
                 "__delattr__"):
        fn = ns.get(name)
        if fn is None:
            continue
        if name in body and name not in ("__setattr__", "__delattr__"):
            continue  # the class body's own method wins, as with dataclasses
        if name in ("__setattr__", "__delattr__") and name in body:
            raise TypeError(f"cannot overwrite attribute {name} in class {cls.__name__}")
        fn.__qualname__ = f"{cls.__qualname__}.{name}"
        setattr(cls, name, fn)
    if body.get("__hash__") is not None:
        pass  # an explicit __hash__ is kept (an __eq__ in the body sets it to None: not explicit)
    elif eq and frozen:
        fn = ns["__hash__"]
        fn.__qualname__ = f"{cls.__qualname__}.__hash__"
        cls.__hash__ = fn
    elif eq:
        cls.__hash__ = None
    cls.__match_args__ = tuple(f.name for f in pos)
    return cls
