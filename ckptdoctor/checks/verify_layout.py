"""Layout-generic checks: rank grids of per-rank files and `.pt` archives that must be whole."""
from __future__ import annotations

import itertools
import re

from ..engine.finding import Hit
from ..engine.registry import check
from ..layouts import ptzip

MP_RANK_RE = re.compile(r"^mp_rank_(?P<tp>\d{2})(?:_(?P<pp>\d{3}))?(?:_(?P<ep>\d{3}))?$")


@check("CKD116", "checkpoint")
def rank_grid_incomplete(ck, eng):
    """Megatron legacy: every (tp, pp[, ep]) rank directory holds a non-empty rank file."""
    if ck.layout.reader != "megatron-legacy":
        return
    rank_file = ck.layout.extra.get("rank_file", "model_optim_rng.pt")
    grid = {}
    for name in ck.dirs:
        m = MP_RANK_RE.match(name)
        if m:
            key = tuple(int(v) if v is not None else None for v in (m["tp"], m["pp"], m["ep"]))
            grid[key] = name
    if not grid:
        yield Hit(ck.display, "no mp_rank_* directories: nothing to load",
                  details={"expected": "mp_rank_XX[_YYY][_ZZZ]/" + rank_file})
        return
    axes = []
    for i in range(3):
        vals = {k[i] for k in grid}
        axes.append([None] if vals == {None} else list(range(max(v for v in vals if v is not None) + 1)))
    missing = [k for k in itertools.product(*axes) if k not in grid]
    for k in missing:
        name = "mp_rank_{:02d}".format(k[0]) + ("" if k[1] is None else f"_{k[1]:03d}") + \
               ("" if k[2] is None else f"_{k[2]:03d}")
        yield Hit(ck.path(name), f"rank directory {name} is missing from the {'x'.join(str(len(a)) for a in axes)} "
                                 f"(tp x pp x ep) grid", details={"missing": name, "tp_pp_ep": list(k)},
                  hint="a rank never wrote its part; resume from an older iteration")
    for k, name in sorted(grid.items(), key=lambda t: t[1]):
        try:
            e = ck.storage.stat(ck.storage.join(ck.rel, name, rank_file))
        except OSError:
            e = None
        if e is None or e.size == 0:
            yield Hit(ck.path(f"{name}/{rank_file}"),
                      f"{name}/{rank_file} is {'missing' if e is None else 'empty (0 bytes)'}",
                      details={"file": f"{name}/{rank_file}", "bytes": e.size if e else None})


def _archives(ck):
    # regular files only: a Lightning sharded save is a *directory* named <name>.ckpt (CKD101 judges it)
    names = [e.name for e in ck.matching(ck.layout.optional_archives) if not e.is_dir]
    if ck.layout.reader == "megatron-legacy":
        rank_file = ck.layout.extra.get("rank_file", "model_optim_rng.pt")
        names += [f"{d}/{rank_file}" for d in sorted(ck.dirs) if MP_RANK_RE.match(d)]
    inside = ck.layout.extra.get("archives_in_dirs")
    if inside:  # per-rank subdirectories (NVRx): the family names the directory and file patterns
        import re
        for d in sorted(ck.dirs):
            if re.fullmatch(inside["dir"], d):
                try:
                    entries = ck.storage.listdir(ck.relpath(d))
                except OSError:
                    continue
                names += [f"{d}/{e.name}" for e in sorted(entries, key=lambda e: e.name)
                          if e.is_file and re.fullmatch(inside["file"], e.name)]
    return names


@check("CKD117", "checkpoint")
def pt_archive_corrupt(ck, eng):
    """`.pt` files are zip archives: a truncated one has no central directory."""
    for name in _archives(ck):
        rel = ck.relpath(name)
        try:
            with ck.storage.open(rel) as fh:
                why = ptzip.archive_problem(fh)
        except FileNotFoundError:
            continue  # CKD116 or required-file rules report absence
        except OSError as exc:
            why = f"unreadable ({exc.strerror or exc})"
        if why:
            yield Hit(ck.path(name), f"{name}: {why}", details={"file": name},
                      hint="the file was truncated or overwritten; torch.load would fail on resume")


# Globals a pickle can call to run code when it is loaded (torch.load(weights_only=False), the
# default before torch 2.6 and what many resume paths still pass); data classes are not listed.
CODE_GLOBALS = {"os", "posix", "nt", "subprocess", "sys", "importlib", "shutil", "socket", "pty", "runpy",
                "code", "ctypes", "webbrowser", "pdb", "timeit", "marshal", "pickle", "commands", "platform"}
CODE_NAMES = {("builtins", n) for n in ("eval", "exec", "compile", "__import__", "getattr", "setattr",
                                        "delattr", "open", "input", "breakpoint", "globals", "vars")} | \
    {("operator", n) for n in ("attrgetter", "methodcaller", "itemgetter")} | {("functools", "partial")}


def pickle_code_globals(data: bytes, limit: int = 20) -> list[str]:
    """module.name of every global in a pickle that would run code, read from its opcodes (nothing
    is executed).  STACK_GLOBAL's operands are the strings pushed (or fetched from the memo) before it."""
    import pickletools
    found, strings, memo = [], [], {}
    memo_next = 0        # MEMOIZE numbers every object it stores (lists, tuples, globals), not only strings
    pushed = False       # the previous opcode pushed a string (so a PUT/MEMOIZE now stores that string)
    try:
        for op, arg, _pos in pickletools.genops(data):
            name = op.name
            was_pushed, pushed = pushed, False
            if name in ("GLOBAL", "INST"):
                mod, _, attr = str(arg).partition(" ")
                pair = (mod, attr)
            elif name == "STACK_GLOBAL" and len(strings) >= 2:
                pair = (strings[-2], strings[-1])
            else:
                pair = None
                if isinstance(arg, str) and name.endswith("UNICODE") or name in ("SHORT_BINSTRING", "BINSTRING"):
                    strings.append(str(arg))
                    pushed = True
                elif name in ("BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"):
                    if name == "MEMOIZE":
                        index, memo_next = memo_next, memo_next + 1
                    else:
                        index = arg
                    if was_pushed and strings:
                        memo[index] = strings[-1]
                    else:
                        memo.pop(index, None)
                    pushed = was_pushed  # the stored string is still on the stack for the next opcode
                elif name in ("BINGET", "LONG_BINGET", "GET") and arg in memo:
                    strings.append(memo[arg])
                    pushed = True
                del strings[:-4]
            if pair and (pair[0].split(".")[0] in CODE_GLOBALS or pair in CODE_NAMES):
                found.append(f"{pair[0]}.{pair[1]}")
                if len(found) >= limit:
                    break
    except (ValueError, EOFError, UnicodeDecodeError, OverflowError, MemoryError):
        pass  # a damaged pickle: CKD117 or the loader reports it; this rule only names code
    return found


@check("CKD127", "checkpoint")
def pickle_runs_code(ck, eng):
    """A torch.save archive whose pickle calls os.system, eval, subprocess...: loading it runs code."""
    names = _archives(ck)
    for name in names:
        rel = ck.relpath(name)
        try:
            size = ck.storage.stat(rel).size
            ms = ptzip.members(lambda off, n: ck.storage.read_range(rel, off, n), 0, size)
        except (OSError, AttributeError, ptzip.ZipDirError):
            continue  # CKD117 names a damaged archive; legacy pickles are not zip archives
        want = ptzip.pickle_name([m.name for m in ms])
        pkl = next((m for m in ms if m.name == want), None)
        if pkl is None or pkl.method not in (0, 8):
            continue
        from ..io.ptfile import MAX_INFLATE_RATIO, MAX_PICKLE_BYTES
        # bounded as the run-state reader bounds it: torch.save stores data.pkl uncompressed, so a
        # deflated one past 100x (or any past 256 MiB) is not inflated; a pickle not read is not cleared
        cap = MAX_PICKLE_BYTES if pkl.method == 0 else min(MAX_PICKLE_BYTES, max(MAX_INFLATE_RATIO * pkl.compressed,
                                                                                  1 << 20))
        data = None
        if pkl.compressed <= cap:
            try:
                data = ck.storage.read_range(rel, pkl.start, pkl.compressed)
            except OSError:
                continue   # CKD901 / CKD117 name an unreadable archive
        if data is not None and pkl.method == 8:  # torch.load inflates a deflated data.pkl and runs its calls too (torch 2.13)
            import zlib
            try:
                data = zlib.decompressobj(-15).decompress(data, cap + 1)
            except zlib.error:
                continue  # a member torch cannot inflate either; CKD117 / the loader names it
        if data is None or len(data) > cap:
            yield Hit(ck.path(name), f"{name}: its pickle ({pkl.name}) is larger than {cap >> 20} MiB "
                                     f"{'inflated ' if pkl.method == 8 else ''}and was not scanned: nothing "
                                     f"clears it of calls that run code", severity="warning",
                      details={"file": name, "member": pkl.name, "limit_bytes": cap},
                      hint="torch.save writes a data.pkl of KBs to MBs; check where this file came from before "
                           "loading it with torch.load(weights_only=False)")
            continue
        bad = pickle_code_globals(data)
        if bad:
            yield Hit(ck.path(name), f"{name}: its pickle calls {', '.join(sorted(set(bad))[:5])}: loading it with "
                                     f"torch.load(weights_only=False) runs that code", details={"file": name,
                                                                                                "globals": bad},
                      hint="do not load it; it was not written by a training framework (or was tampered with)")


@check("CKD125", "checkpoint")
def symlink_suspect(ck, eng):
    """Symlinks inside a checkpoint: loops and dangling links are unreadable files; links that
    leave the checkpoint make its content depend on something a copy or publish does not carry."""
    import errno
    import os
    if not getattr(ck.storage, "local", False):
        return
    base = os.path.realpath(ck.storage.abspath(ck.rel))
    for name, e in sorted(ck.entries.items()):
        if not e.is_link:
            continue
        p = ck.storage.abspath(ck.relpath(name))
        try:
            os.stat(p)
        except OSError as exc:
            what = "a symlink loop" if exc.errno == errno.ELOOP else "a dangling symlink"
            yield Hit(ck.path(name), f"{name} is {what}: the file cannot be read",
                      details={"file": name, "target": _readlink(p)},
                      hint="replace it with the real file")
            continue
        real = os.path.realpath(p)
        if os.path.commonpath([base, real]) != base:
            yield Hit(ck.path(name), f"{name} is a symlink to {real}, outside the checkpoint", severity="warning",
                      details={"file": name, "target": real},
                      hint="copies, publish and object-store uploads do not carry it; the content can change "
                           "under the checkpoint")


def _readlink(p):
    import os
    try:
        return os.readlink(p)
    except OSError:
        return None
