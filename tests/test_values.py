"""ckptdoctor.values against dataclasses itself: each feature the project uses, built from the same
class body by both, must behave the same (construction, defaults, repr, equality, hashing, order,
frozen, slots, kw_only, inheritance, __post_init__, the errors)."""
import dataclasses

import pytest

from ckptdoctor import values

SOURCE = '''
from __future__ import annotations
@DEC{opts}
class Base:
    a: int
    b: str = "x"
    c: list = FIELD(default_factory=list)
    d: int | None = FIELD(default=None, repr=False)
'''


def build(src: str, **opts):
    """The same class body under dataclasses and under values."""
    out = []
    for dec, fld in ((dataclasses.dataclass, dataclasses.field), (values.value, values.field)):
        ns = {"DEC": dec, "FIELD": fld}
        text = src.replace("{opts}", "(" + ", ".join(f"{k}={v!r}" for k, v in opts.items()) + ")" if opts else "")
        exec(compile(text, "<values-test>", "exec"), ns)
        out.append(ns)
    return out


def outcome(fn):
    try:
        return ("ok", fn())
    except Exception as exc:  # the exception type is part of the behaviour compared
        return ("raised", type(exc).__mro__[1] if type(exc).__name__ == "FrozenInstanceError" else type(exc))


@pytest.mark.parametrize("opts", [{}, {"frozen": True}, {"order": True, "frozen": True}, {"slots": True},
                                  {"kw_only": True}, {"eq": False}, {"frozen": True, "slots": True}])
def test_same_behaviour_as_dataclasses(opts):
    (d, v) = build(SOURCE, **opts)
    D, V = d["Base"], v["Base"]
    kw = opts.get("kw_only")
    calls = [lambda C: C(a=1), lambda C: C(a=1, b="y", c=[1], d=4), lambda C: C(1), lambda C: C(1, "y"),
             lambda C: C(), lambda C: C(a=1, e=2), lambda C: C(1, "y", [2], 3, 4)]
    for call in calls:
        got_d, got_v = outcome(lambda: repr(call(D))), outcome(lambda: repr(call(V)))
        assert got_d == got_v, (opts, got_d, got_v)
    x1, x2, y = D(a=1), D(a=1), D(a=2)
    u1, u2, w = V(a=1), V(a=1), V(a=2)
    assert (x1 == x2, x1 == y, x1 != x2) == (u1 == u2, u1 == w, u1 != u2)
    assert (u1 == D(a=1)) is False  # another class is never equal
    assert x1.c is not x2.c and u1.c is not u2.c  # one new list per instance
    assert outcome(lambda: hash(x1) == hash(x2)) == outcome(lambda: hash(u1) == hash(u2))
    assert (D.__hash__ is None) == (V.__hash__ is None)
    assert outcome(lambda: x1 < y) == outcome(lambda: u1 < w)
    assert outcome(lambda: sorted([y, x1])[0].a) == outcome(lambda: sorted([w, u1])[0].a)
    assert outcome(lambda: setattr(x1, "a", 5)) == outcome(lambda: setattr(u1, "a", 5))
    assert outcome(lambda: delattr(x2, "b")) == outcome(lambda: delattr(u2, "b"))
    if opts.get("frozen") and opts.get("slots"):  # dataclasses before 3.12 raises TypeError here (its
        assert outcome(lambda: setattr(u1, "zz", 5)) == ("raised", AttributeError)  # __setattr__ names the
    else:                                                                          # class it replaced)
        assert outcome(lambda: setattr(x1, "zz", 5)) == outcome(lambda: setattr(u1, "zz", 5))
    assert hasattr(x1, "__dict__") == hasattr(u1, "__dict__")
    assert getattr(D, "__slots__", None) == getattr(V, "__slots__", None)
    assert D.__match_args__ == V.__match_args__
    same = (lambda x: type(x).__name__) if opts.get("slots") else (lambda x: x)  # slots: a member descriptor
    assert same(getattr(D, "b", None)) == same(getattr(V, "b", None)) and hasattr(D, "c") == hasattr(V, "c")
    assert [f.name for f in dataclasses.fields(D)] == [f.name for f in values.fields_of(V)]
    if not kw:
        assert repr(D(1, "q", [3], 9)) == repr(V(1, "q", [3], 9))


INHERIT = '''
from __future__ import annotations
@DEC(kw_only=True)
class Base:
    tracker: dict | None = None
    pruned: list = FIELD(default_factory=list)
    def __post_init__(self):
        self.seen = True

@DEC
class Child(Base):
    source: str
    status: str = "published"
'''


def test_inherited_kw_only_fields_come_last_and_post_init_runs():
    d, v = build(INHERIT)
    for make in (lambda C: C("s"), lambda C: C("s", "ok", pruned=[1]), lambda C: C(source="s", tracker={}),
                 lambda C: C(), lambda C: C("s", "ok", [1])):
        assert outcome(lambda: repr(make(d["Child"]))) == outcome(lambda: repr(make(v["Child"])))
    a, b = d["Child"]("s"), v["Child"]("s")
    assert list(a.__dict__) == list(b.__dict__) and a.seen and b.seen  # the same assignment order


@pytest.mark.parametrize("src", [
    "@DEC\nclass A:\n    a: int = 1\n    b: int\n",                  # non-default after default
    "@DEC\nclass A:\n    a: list = []\n",                             # mutable default
    "@DEC(order=True)\nclass A:\n    a: int\n    def __lt__(self, o):\n        return True\n",
    "@DEC(frozen=True)\nclass A:\n    a: int\n    def __setattr__(self, n, v):\n        pass\n",
])
def test_refused_as_dataclasses_refuses(src):
    errs = []
    for dec in (dataclasses.dataclass, values.value):
        with pytest.raises((TypeError, ValueError)) as exc:
            exec(compile(src, "<values-test>", "exec"), {"DEC": dec})
        errs.append(exc.type)
    assert errs[0] is errs[1]


def test_a_body_method_wins_and_an_explicit_hash_is_kept():
    src = ("@DEC(frozen=True)\nclass A:\n    a: int\n    def __repr__(self):\n        return 'mine'\n"
           "    def __hash__(self):\n        return 7\n")
    for dec in (dataclasses.dataclass, values.value):
        ns = {"DEC": dec}
        exec(compile(src, "<values-test>", "exec"), ns)
        assert repr(ns["A"](1)) == "mine" and hash(ns["A"](1)) == 7


def test_classvar_is_refused_not_half_done():
    with pytest.raises(TypeError, match="ClassVar"):
        exec(compile("from typing import ClassVar\n@DEC\nclass A:\n    a: ClassVar[int] = 1\n", "<t>", "exec"),
             {"DEC": values.value})


def test_shipped_methods_and_compiled_ones_are_the_same_and_a_changed_class_is_never_stale():
    """The generated methods of every value class ship precompiled (ckptdoctor/_values_code.py, by
    scripts/gen_docs.py); the shipped function is used only when its docstring is the source the class
    generates now, and gives the same methods as compiling it."""
    from ckptdoctor import _values_code, values
    fns = [getattr(_values_code, n) for n in dir(_values_code) if n.startswith("f_")]
    assert len(fns) > 50
    for fn in fns:
        src = fn.__doc__
        ns = {n: object() for n in fn.__code__.co_varnames[:fn.__code__.co_argcount]}
        shipped = values._methods(src, dict(ns))
        compiled = {}
        exec(compile(src, "<test>", "exec"), dict(ns), compiled)
        assert set(k for k in compiled if k.startswith("__")) <= set(shipped), src[:80]

    @values.value(frozen=True)
    class Fresh:   # a class no shipped source matches: compiled here, and correct
        a_field_nobody_else_has: int
        b: str = "x"
    assert Fresh(1) == Fresh(1, "x") and repr(Fresh(2)).endswith("Fresh(a_field_nobody_else_has=2, b='x')")
    with pytest.raises(values.FrozenInstanceError):
        Fresh(1).b = "y"


