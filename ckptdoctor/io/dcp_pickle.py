"""A reader of the `.metadata` pickle torch writes that keeps no unpickler memo (issue 20's 1M peak).

The C unpickler keeps every object it memoizes alive until `load()` returns: for a `.metadata`
torch writes, that is each record's state dict, the 1-tuples each `torch.Size` is REDUCEd from, and
the planner's path tuples, ~0.2x of torch's own peak at 1M records (benchmarks/README.md).  This
reader is a small pickle machine of its own with fast lanes:

- The machine runs the opcodes torch's pickles use with the C unpickler's semantics and the same
  restricted globals (io.unpickle), on the file's bytes as they are (FRAME is an opcode that only
  asks for its bytes to be there, as in C).  It runs the file's head, each dict's first records
  and whatever a lane does not match.
- A lane is one compiled regex per record shape torch writes in `state_dict_metadata`,
  `planner_data` and `storage_data`, with the memo refs of the classes and keys it needs written in
  as literal bytes (the refs found in the machine's memo, which no opcode here can overwrite: PUTs
  are declined).  A match yields the record's compact value (layouts.dcp.TensorInfo /
  StorageEntry) straight away; its memo slots are counted but only the strings a later record
  can name are kept, so a later reference to anything else is declined.
- The planner lane's strings (each tensor's path, ~3 per record) are kept only until
  `storage_data` begins: torch writes it after `planner_data`, and none of its records names them.

Measured on the 1M-record `.metadata` torch writes (benchmarks/README.md, session 13), `verify`
side by side with torch's `read_metadata()` (28.6 s, 3,631 MiB): 11.7 s and 1,203 MiB peak with
this reader, 10.2 s and 2,125 MiB with the C unpickler alone.

It fails closed: anything it does not know (an opcode, a global, a reference to a slot it did not
keep, a shape no lane matches more than a little of the time) makes `load` return None, and the
caller reads the file with the C unpickler as before, which also words every error.  A lane
produces only what the machine and the C path would: tests/test_dcp_pickle.py compares both
readings on files torch writes and on mutated ones.
"""
from __future__ import annotations

import re

from ..values import value
from .unpickle import CSM, DCP_ALLOW, MetadataIndex, SI, TSM, DType, TensorProperties, resolve_global


class Decline(Exception):
    """Not a pickle this reader vouches for: read it with the C unpickler."""


@value(slots=True)
class Loaded:
    obj: object                  # what STOP returned: a Metadata stand-in if the file is DCP metadata
    counts: dict[str, int]       # records each lane ("sdm", "planner", "sd") matched
    dicts: dict[str, dict]       # the dict the machine saw built under each of those keys


def load(data: bytes, tensor_cls, storage_cls) -> Loaded | None:
    """The unpickled object, with lane records as `tensor_cls` / `storage_cls` values in its
    dicts; None to decline (read the file with the C unpickler)."""
    try:
        m = _Machine(data, tensor_cls, storage_cls)
        return Loaded(m.run(), m.lane_counts, m.ctx)
    except Exception:   # any surprise is a decline: the C path is the judge of a file it cannot read
        return None


def _key(i: int) -> bytes:
    """The canonical memo ref of index i: BINGET below 256, LONG_BINGET above (as the pickler)."""
    return b"h" + bytes((i,)) if i < 256 else b"j" + i.to_bytes(4, "little")


def _index(ref: bytes) -> int:
    return ref[1] if ref[0] == 0x68 else int.from_bytes(ref[1:5], "little")


_MISSING = object()
_DIMS = rb"(\)|(?:K.|M..|J....){1,3}[\x85\x86\x87]\x94|\((?:K.|M..|J....)*t\x94)\x85\x94R\x94"
_NEW = rb"\)\x81\x94\}\x94\("   # EMPTY_TUPLE NEWOBJ MEMOIZE EMPTY_DICT MEMOIZE MARK
# a new short string or a ref.  The payload excludes 0x94 (MEMOIZE) so that no match can backtrack
# into it: a name holding that byte is left to the machine, its length byte is checked after.
_STR = rb"(\x8c.[^\x94]{0,255}\x94|h.|j....)"
_INT = rb"(K.|M..|J....|\x8a\x01.|\x8a\x02..|\x8a\x03...|\x8a\x04....|\x8a\x05.{5}|\x8a\x06.{6}|\x8a\x07.{7}" \
       rb"|\x8a\x08.{8})"
_TUPLE_N = {0x85: 1, 0x86: 2, 0x87: 3}
_WIDTH = {0x4B: 1, 0x4D: 2, 0x4A: 4}
_CONST_STRS = ("properties", "size", "chunks", "offsets", "sizes", "fqn", "offset", "index", "relative_path",
               "length")
_CONST_OBJS = {"TSM": TSM, "TP": TensorProperties, "CSM": CSM, "MI": MetadataIndex, "SI": SI, "Size": tuple}
_CONTEXT_KEYS = {"state_dict_metadata": "sdm", "planner_data": "planner", "storage_data": "sd"}


def _decode_dims(g: bytes):
    """The ints of a SIZE group (`)`, `ints TUPLEn MEMOIZE` or `( ints t MEMOIZE`) and its memo
    slots besides the two of TUPLE1 and REDUCE; None if the tuple op's count disagrees or a dim
    is negative."""
    if g == b")":
        return (), 0
    if g[0] == 0x28:   # MARK ... TUPLE
        body, n = g[1:-2], None
    else:
        body, n = g[:-2], _TUPLE_N[g[-2]]
    vals, i = [], 0
    while i < len(body):
        w = _WIDTH[body[i]]
        v = int.from_bytes(body[i + 1:i + 1 + w], "little", signed=w == 4)
        if v < 0:
            return None
        vals.append(v)
        i += 1 + w
    if n is not None and n != len(vals):
        return None
    return tuple(vals), 1


def _token_str(tok: bytes) -> str | None:
    """The string of a SHORT_BINUNICODE token a lane matched (`\x8c len payload \x94`), decoded as
    the C unpickler does; None if its length byte disagrees (UnicodeDecodeError if not UTF-8)."""
    if tok[1] != len(tok) - 3:
        return None
    return str(tok[2:-1], "utf-8", "surrogatepass")


def plain_name(rel: str) -> bool:
    """A shard name DCP can mean: a file directly in the checkpoint directory (both readers' check)."""
    return "/" not in rel and rel not in ("", ".", "..")


def _int(raw: bytes) -> int:
    op = raw[0]
    if op == 0x4B:
        return raw[1]
    if op == 0x4D:
        return raw[1] | raw[2] << 8
    if op == 0x4A:
        return int.from_bytes(raw[1:], "little", signed=True)
    return int.from_bytes(raw[2:], "little", signed=True)   # LONG1


class _Machine:
    """The pickle machine; see the module docstring.  `memo` maps memo indices to the objects
    kept; `memo_len` counts every MEMOIZE, kept or not."""

    def __init__(self, data: bytes, tensor_cls, storage_cls):
        self.data, self.tensor_cls, self.storage_cls = data, tensor_cls, storage_cls
        self.stack: list = []
        self.marks: list[int] = []
        self.memo: dict[int, object] = {}
        self.pmemo: dict[int, str] = {}           # the planner lane's strings, dropped once storage_data begins
        self.memo_len = 0
        self.consts: dict[str, list[bytes]] = {}   # constant name -> refs of memo slots holding it
        self.consts_version = 0
        self.ctx: dict[str, dict] = {}            # "sdm"/"planner"/"sd" -> the dict under that key
        self.lane_counts = {"sdm": 0, "planner": 0, "sd": 0}
        self.lanes: dict[str, tuple] = {}         # context -> (consts_version, compiled regex or None)
        self.generic_ops = 0
        self.props_name: dict[bytes, str] = {}    # TensorProperties state bytes -> dtype name
        self.dims_cache: dict[bytes, object] = {}
        self.rel_refs: dict[bytes, str] = {}      # ref -> shard name it was checked to be

    # -- the machine ---------------------------------------------------------------------------

    def run(self):
        data, stack, marks = self.data, self.stack, self.marks
        n, pos = len(data), 0
        while True:
            if marks:
                m = marks[-1]
                if m and not (len(stack) - m) & 1:
                    owner = stack[m - 1]
                    for name, d in self.ctx.items():
                        if owner is d:
                            pos = self.lane(name, pos)
                            break
            if pos >= n:
                raise Decline("pickle ends without STOP")
            self.generic_ops += 1
            if self.generic_ops > 4096 and self.generic_ops * 16 > pos:
                raise Decline("too few records match a lane")   # the C unpickler is faster here
            op = data[pos]
            pos += 1
            if op == 0x94:   # MEMOIZE
                self._above(1)
                self._memoize(stack[-1])
            elif op == 0x8C:   # SHORT_BINUNICODE
                k = data[pos]
                stack.append(str(data[pos + 1:pos + 1 + k], "utf-8", "surrogatepass"))
                self._need(pos + 1 + k, n)
                pos += 1 + k
            elif op == 0x58 or op == 0x8D:   # BINUNICODE, BINUNICODE8
                w = 4 if op == 0x58 else 8
                k = int.from_bytes(data[pos:pos + w], "little")
                self._need(pos + w + k, n)
                stack.append(str(data[pos + w:pos + w + k], "utf-8", "surrogatepass"))
                pos += w + k
            elif op == 0x43 or op == 0x42:   # SHORT_BINBYTES, BINBYTES
                w = 1 if op == 0x43 else 4
                k = int.from_bytes(data[pos:pos + w], "little")
                self._need(pos + w + k, n)
                stack.append(bytes(data[pos + w:pos + w + k]))
                pos += w + k
            elif op == 0x68 or op == 0x6A:   # BINGET, LONG_BINGET
                w = 1 if op == 0x68 else 4
                self._need(pos + w, n)
                i = int.from_bytes(data[pos:pos + w], "little")
                v = self.memo.get(i, _MISSING)
                if v is _MISSING and (v := self.pmemo.get(i, _MISSING)) is _MISSING:
                    raise Decline("reference to a slot not kept")
                stack.append(v)
                pos += w
            elif op == 0x28:   # MARK
                marks.append(len(stack))
            elif op == 0x7D:   # EMPTY_DICT
                d = {}
                if stack and type(stack[-1]) is str and stack[-1] in _CONTEXT_KEYS:
                    name = _CONTEXT_KEYS[stack[-1]]
                    if name in self.ctx:
                        raise Decline(f"a second dict under {name}")
                    self.ctx[name] = d
                    if name == "sd":   # torch writes storage_data after planner_data, whose path
                        self.pmemo = {}   # strings no storage record names: at 1M, ~0.25 GiB less peak
                stack.append(d)
            elif op == 0x5D:   # EMPTY_LIST
                stack.append([])
            elif op == 0x29:   # EMPTY_TUPLE
                stack.append(())
            elif op in _TUPLE_N:
                k = _TUPLE_N[op]
                self._above(k)
                t = tuple(stack[-k:])
                del stack[-k:]
                stack.append(t)
            elif op == 0x74:   # TUPLE
                items = self._pop_mark()
                stack.append(tuple(items))
            elif op == 0x75:   # SETITEMS
                items = self._pop_mark()
                self._above(1)
                target = stack[-1]
                if type(target) is not dict or len(items) & 1:
                    raise Decline("SETITEMS")
                for j in range(0, len(items), 2):
                    target[items[j]] = items[j + 1]
            elif op == 0x73:   # SETITEM
                self._above(3)
                v, k = stack.pop(), stack.pop()
                if type(stack[-1]) is not dict:
                    raise Decline("SETITEM")
                stack[-1][k] = v
            elif op == 0x61:   # APPEND
                self._above(2)
                v = stack.pop()
                if type(stack[-1]) is not list:
                    raise Decline("APPEND")
                stack[-1].append(v)
            elif op == 0x65:   # APPENDS
                items = self._pop_mark()
                self._above(1)
                if type(stack[-1]) is not list:
                    raise Decline("APPENDS")
                stack[-1].extend(items)
            elif op == 0x4E:   # NONE
                stack.append(None)
            elif op == 0x88 or op == 0x89:
                stack.append(op == 0x88)
            elif op in _WIDTH:   # BININT1, BININT2, BININT
                w = _WIDTH[op]
                self._need(pos + w, n)
                stack.append(int.from_bytes(data[pos:pos + w], "little", signed=w == 4))
                pos += w
            elif op == 0x8A:   # LONG1
                k = data[pos]
                self._need(pos + 1 + k, n)
                stack.append(int.from_bytes(data[pos + 1:pos + 1 + k], "little", signed=True))
                pos += 1 + k
            elif op == 0x47:   # BINFLOAT
                self._need(pos + 8, n)
                import struct   # only here: ~0.3 ms of start-up for an opcode torch's metadata lacks
                stack.append(struct.unpack(">d", data[pos:pos + 8])[0])
                pos += 8
            elif op == 0x93:   # STACK_GLOBAL
                self._above(2)
                name, module = stack.pop(), stack.pop()
                if type(name) is not str or type(module) is not str:
                    raise Decline("STACK_GLOBAL of a non-string")
                stack.append(resolve_global(DCP_ALLOW, module, name))   # RefusedGlobal: a decline
            elif op == 0x81:   # NEWOBJ
                self._above(2)
                args, cls = stack.pop(), stack.pop()
                if not isinstance(cls, type) or type(args) is not tuple:
                    raise Decline("NEWOBJ")
                stack.append(cls.__new__(cls, *args))
            elif op == 0x52:   # REDUCE
                self._above(2)
                args, fn = stack.pop(), stack.pop()
                if type(args) is not tuple or not callable(fn):
                    raise Decline("REDUCE")
                stack.append(fn(*args))
            elif op == 0x62:   # BUILD
                self._above(2)
                state = stack.pop()
                self._build(stack[-1], state)
            elif op == 0x95:   # FRAME: as in C, only asks for its bytes to be there
                self._need(pos + 8, n)
                self._need(pos + 8 + int.from_bytes(data[pos:pos + 8], "little"), n)
                pos += 8
            elif op == 0x80:   # PROTO
                if pos != 1 or data[pos] > 5:
                    raise Decline("PROTO")
                pos += 1
            elif op == 0x2E:   # STOP
                self._above(1)
                return stack.pop()
            else:
                raise Decline(f"opcode {op:#x}")

    @staticmethod
    def _need(end: int, n: int) -> None:
        if end > n:
            raise Decline("truncated")

    def _above(self, k: int) -> None:
        """At least k items above the innermost MARK, or the C unpickler's stack underflow."""
        if len(self.stack) - k < (self.marks[-1] if self.marks else 0):
            raise Decline("stack underflow")

    def _pop_mark(self) -> list:
        m = self.marks.pop()
        items = self.stack[m:]
        del self.stack[m:]
        return items

    def _memoize(self, obj) -> None:
        k = _key(self.memo_len)
        self.memo[self.memo_len] = obj
        self.memo_len += 1
        name = obj if type(obj) is str and obj in _CONST_STRS else \
            next((n for n, c in _CONST_OBJS.items() if obj is c), None)
        if name is not None:
            refs = self.consts.setdefault(name, [])
            if len(refs) < 4:   # torch memoizes each once; a forged file repeating them cannot make
                refs.append(k)   # the lanes' regexes grow or recompile without bound (at most 64 times)
                self.consts_version += 1

    @staticmethod
    def _build(inst, state) -> None:
        """BUILD as the C unpickler does it: __setstate__ if the object has one, else the state
        (and slot state) set on it."""
        setstate = getattr(inst, "__setstate__", None)
        if setstate is not None:
            setstate(state)
            return
        slot = None
        if type(state) is tuple and len(state) == 2:
            state, slot = state
        if state is not None:
            if type(state) is not dict:
                raise Decline("BUILD state is not a dict")
            inst.__dict__.update(state)
        if slot is not None:
            if type(slot) is not dict:
                raise Decline("BUILD slot state is not a dict")
            for k, v in slot.items():
                setattr(inst, k, v)

    # -- lanes ---------------------------------------------------------------------------------

    def _alt(self, name: str) -> bytes | None:
        refs = self.consts.get(name)
        if not refs:
            return None
        return b"(?:" + b"|".join(re.escape(r) for r in refs) + b")"

    def _template(self, name: str):
        have = self.lanes.get(name)
        if have is not None and have[0] == self.consts_version:
            return have[1]
        a = {c: self._alt(c) for c in list(_CONST_STRS) + list(_CONST_OBJS)}
        pat = None
        size = None if a["Size"] is None else a["Size"] + _DIMS
        if name == "sdm" and None not in (a["TSM"], a["TP"], a["CSM"], size, a["properties"], a["size"],
                                            a["chunks"], a["offsets"], a["sizes"]):
            pat = (rb"(\x8c.[^\x94]{0,255}\x94)" + a["TSM"] + _NEW + a["properties"] + a["TP"] + rb"\)\x81\x94\("
                   rb"((?:h.|j....){2}[\x88\x89](?:h.|j....)[\x88\x89])t\x94b" + a["size"] + size
                   + a["chunks"] + rb"\]\x94" + a["CSM"] + _NEW + a["offsets"] + size + a["sizes"] + size
                   + rb"ubaub")
        elif name == "sd" and None not in (a["MI"], a["SI"], size, a["fqn"], a["offset"], a["index"],
                                           a["relative_path"], a["length"]):
            idx = rb"(?:N|K.|M..|J....)"
            pat = (a["MI"] + _NEW + a["fqn"] + _STR + rb"(?:" + a["offset"] + size + a["index"] + idx + rb"|"
                   + a["index"] + idx + a["offset"] + size + rb")ub" + a["SI"] + _NEW + a["relative_path"] + _STR
                   + a["offset"] + _INT + a["length"] + _INT + rb"ub")
        elif name == "planner":
            pat = (_STR + rb"(?:" + _STR + rb"(?:" + _STR + rb"(?:" + _STR + rb")?)?([\x85\x86\x87])|\(((?:"
                   + _STR[1:-1] + rb")*)t)\x94")   # a path of 1-3 names, or MARK ... TUPLE for more
        rx = re.compile(pat, re.S).match if pat is not None else None
        self.lanes[name] = (self.consts_version, rx)
        return rx

    def lane(self, name: str, pos: int) -> int:
        match = self._template(name)
        if match is None:
            return pos
        run = {"sdm": self._tensors, "sd": self._storages, "planner": self._planners}[name]
        pos, count = run(match, pos)
        self.lane_counts[name] += count
        return pos

    # Each lane is one loop with its state in locals: at 1M records of each kind, a method call
    # or a tuple per record is a visible share of the time.  `at` is the memo index of the
    # record's first MEMOIZE; a ref must name an index below the MEMOIZEs it comes after.

    def _tensors(self, match, pos: int):
        """Tensor records: (fqn, TensorInfo) pairs pushed for the batch's SETITEMS."""
        data, push, memo, dims, props_name = self.data, self.stack.append, self.memo, self.dims_cache, self.props_name
        ti, at, n = self.tensor_cls, self.memo_len, 0
        while (m := match(data, pos)) is not None:
            tok, props, sz, off, szs = m.groups()
            try:
                fqn = _token_str(tok)
            except UnicodeDecodeError:
                break
            if fqn is None:
                break
            name = props_name.get(props)
            if name is None and (name := self._props(props, at + 4)) is None:
                break
            s, o, z = dims.get(sz) or self._size(sz), dims.get(off) or self._size(off), dims.get(szs) or self._size(szs)
            if not (s and o and z):
                break
            memo[at] = fqn   # storage records name their tensor by this ref
            at += 14 + s[1] + o[1] + z[1]
            push(fqn)
            push(ti(fqn, s[0], name, [(o[0], z[0])]))
            pos = m.end()
            n += 1
        self.memo_len = at
        return pos, n

    def _props(self, props: bytes, below: int) -> str | None:
        """The dtype name of a TensorProperties state (dtype, layout, bool, memory format, bool)
        whose three refs name kept objects, the first a torch dtype; None otherwise."""
        refs, i = [], 0
        for k in range(3):
            w = 2 if props[i] == 0x68 else 5
            j = _index(props[i:i + w])
            refs.append(self.memo.get(j, _MISSING) if j < below else _MISSING)
            i += w + (k > 0)   # a bool follows the layout and the memory format
        d, lay, mf = refs
        if type(d) is not DType or lay is _MISSING or mf is _MISSING:
            return None
        name = self.props_name[props] = str(d)
        return name

    def _storages(self, match, pos: int):
        """Storage records: (key, StorageEntry) pairs; the key is a fresh object, as each
        MetadataIndex is, so no two records can collide in the dict."""
        data, push, memo, dims, rels = self.data, self.stack.append, self.memo, self.dims_cache, self.rel_refs
        se, at, n = self.storage_cls, self.memo_len, 0
        while (m := match(data, pos)) is not None:
            ftok, sz_a, sz_b, rtok, off, length = m.groups()
            s = dims.get(sz_a or sz_b) or self._size(sz_a or sz_b)
            if not s:
                break
            try:
                if ftok[0] == 0x8C:
                    fqn, fnew = _token_str(ftok), 1
                else:
                    i = _index(ftok)
                    fqn, fnew = (memo.get(i) if i < at + 2 else None), 0
                if type(fqn) is not str:
                    break
                rel_at = at + 6 + fnew + s[1]
                rel = rels.get(rtok)
                if rel is None:
                    rel = self._rel(rtok, rel_at)
                    if rel is None:
                        break
            except UnicodeDecodeError:
                break
            o, ln = _int(off), _int(length)
            if o < 0 or ln < 0:
                break
            if rtok[0] == 0x8C:
                memo[rel_at] = rel   # a new shard name: the next records refer to it
                at = rel_at + 1
            else:
                at = rel_at
            push(object())
            push(se(fqn, s[0], rel, o, ln))
            pos = m.end()
            n += 1
        self.memo_len = at
        return pos, n

    def _rel(self, tok: bytes, below: int) -> str | None:
        """The shard name of a storage record, new or a kept ref; None if it is not a plain file
        name in the checkpoint directory (the reader's check then words the finding)."""
        if tok[0] == 0x8C:
            rel = _token_str(tok)
        else:
            i = _index(tok)
            rel = self.memo.get(i) if i < below else None
        if type(rel) is not str or not plain_name(rel):
            return None
        if tok[0] != 0x8C:
            self.rel_refs[tok] = rel   # kept slots never change: the ref names this string for good
        return rel

    def _planners(self, match, pos: int):
        """planner_data records (fqn -> its path in the state dict, a tuple of strings): checked
        and counted; nothing is pushed, the reader never reads planner_data.  New strings are
        kept: a record the machine reads (one across a FRAME) may name them."""
        data, memo, pmemo, at, n = self.data, self.memo, self.pmemo, self.memo_len, 0
        tokens = re.compile(_STR[1:-1], re.S).findall   # the names of a MARK ... TUPLE path, in order
        while (m := match(data, pos)) is not None:
            key, t1, t2, t3, op, body = m.groups()
            if op is not None:
                toks = [key, t1] + [t for t in (t2, t3) if t is not None]
                if len(toks) - 1 != _TUPLE_N[op[0]]:
                    break
            else:
                toks = [key] + tokens(body)
                if sum(map(len, toks)) != len(key) + len(body):
                    break
            here, new, bad = at, [], False
            for j, tok in enumerate(toks):
                if tok[0] == 0x8C:
                    try:
                        v = _token_str(tok)
                    except UnicodeDecodeError:
                        v = None
                    if v is None:
                        bad = True
                        break
                    new.append(v)
                    here += 1
                else:
                    i = _index(tok)
                    if i >= here or (j == 0 and type(memo.get(i) or pmemo.get(i)) is not str):   # a key must hash
                        bad = True
                        break
            if bad:
                break
            for v in new:
                pmemo[at] = v
                at += 1
            at += 1   # the tuple
            pos = m.end()
            n += 1
        self.memo_len = at
        return pos, n

    def _size(self, g: bytes):
        hit = self.dims_cache.get(g, _MISSING)
        if hit is _MISSING:
            hit = self.dims_cache[g] = _decode_dims(g)
        return hit
