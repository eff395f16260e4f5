"""The run contract (seed 003 §2, "run contract"): what a run was started with — code, data,
recipe, length — recorded in `RUN_ROOT/ckptdoctor.contract.json` and re-checked before a resume,
so a relaunch with different code, a re-tokenized dataset, an edited recipe or a new total step
count is a finding instead of a silent change.

A contract is a list of phases; `init` writes the first, `new-phase` appends one with its reason
(earlier phases are never edited), `check` compares the newest with what is on disk now.  There is
no switch that ignores it: the contract's rules cannot be deselected or downgraded.

Content hashes are xxh3-128 per 64 MiB range combined per file, read in parallel (io/hashing).
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from .values import value, field

import xxhash

from .engine.errors import InputError, UsageError
from .io import hashing
from .io.fs import LocalStorage, read_regular

NAME = "ckptdoctor.contract.json"
FORMAT = "ckptdoctor.contract/v1"
MAX_BYTES = 256 << 20
MAX_FILES = 1_000_000
SKIP_DIRS = {".git", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}


class ContractError(ValueError):
    """The contract file is not one (one line, naming the file)."""


@value(frozen=True)
class Change:
    """One difference between the newest phase and what is on disk now."""
    kind: str        # "code" | "data" | "recipe" | "total_steps"
    item: str        # file path, code directory, or "total_steps"
    change: str      # "changed" | "added" | "removed"
    was: str | None
    now: str | None


@value
class Phase:
    index: int
    time: str
    reason: str
    code: dict | None
    data: dict          # {"paths": [...], "files": {path: {"size", "xxh3_128", "mtime_ns"}}}
    recipe: dict        # {path: hash}
    total_steps: int | None

    def to_json(self) -> dict:
        return {"index": self.index, "time": self.time, "reason": self.reason, "code": self.code,
                "data": self.data, "recipe": self.recipe, "total_steps": self.total_steps}


@value
class Contract:
    path: str
    phases: list[Phase] = field(default_factory=list)
    raw: bytes = b""

    @property
    def newest(self) -> Phase:
        return self.phases[-1]


# ---- hashing -----------------------------------------------------------------------------------
def hash_files(paths: list[str], workers: int | None = None) -> dict[str, dict]:
    """{path: {"size", "xxh3_128", "mtime_ns"}} for regular files, hashed in parallel by 64 MiB
    ranges (a file of one range keeps that range's digest; larger ones combine theirs in order)."""
    st = LocalStorage("/")
    infos: dict[str, os.stat_result] = {}
    units = []
    for p in paths:
        s = os.stat(p)
        infos[p] = s
        units += hashing.units_for(p.lstrip("/"), s.st_size) or [hashing.Unit(p.lstrip("/"), 0, 0, 0, "xxh3-128")]
    got = hashing.hash_units(st, units, workers=workers)
    out = {}
    for p in paths:
        mine = sorted((u for u in got if u.rel == p.lstrip("/")), key=lambda u: u.index)
        if any(got[u][1] < u.length for u in mine):
            raise InputError(f"{p} shrank while being hashed")
        digests = [got[u][0] for u in mine]
        d = digests[0] if len(digests) == 1 else xxhash.xxh3_128("".join(digests).encode()).hexdigest()
        out[p] = {"size": infos[p].st_size, "xxh3_128": d, "mtime_ns": infos[p].st_mtime_ns}
    return out


def expand(paths: list[str]) -> list[str]:
    """Files named, and every regular file under directories named (sorted, absolute)."""
    out = []
    for p in paths:
        p = os.path.abspath(p)
        if os.path.isdir(p):
            for dirpath, dirnames, filenames in os.walk(p):
                dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
                out += [os.path.join(dirpath, f) for f in sorted(filenames)
                        if os.path.isfile(os.path.join(dirpath, f))]
                if len(out) > MAX_FILES:
                    raise InputError(f"{p}: more than {MAX_FILES} files")
        elif os.path.isfile(p):
            out.append(p)
        else:
            raise InputError(f"{p}: not a file or directory")
    return sorted(set(out))


def _git(d: str, *args: str) -> bytes | None:
    try:
        p = subprocess.run(["git", "-C", d, *args], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def code_state(d: str) -> dict:
    """git commit plus a hash of uncommitted changes (tracked diffs and untracked files), or a
    tree hash of every file outside git."""
    d = os.path.abspath(d)
    if not os.path.isdir(d):
        raise InputError(f"--code {d}: not a directory")
    head = _git(d, "rev-parse", "HEAD")
    if head is not None:
        h = xxhash.xxh3_128()
        diff = _git(d, "diff", "HEAD", "--binary") or b""
        h.update(diff)
        untracked = (_git(d, "ls-files", "--others", "--exclude-standard", "-z") or b"").split(b"\0")
        names = sorted(os.path.join(d, n.decode()) for n in untracked if n)
        for p, info in sorted(hash_files([p for p in names if os.path.isfile(p)]).items()):
            h.update(f"{os.path.relpath(p, d)}\0{info['xxh3_128']}\n".encode())
        dirty = h.hexdigest() if diff or names else None
        return {"path": d, "kind": "git", "commit": head.decode().strip(), "uncommitted": dirty}
    files = hash_files(expand([d]))
    h = xxhash.xxh3_128()
    for p, info in sorted(files.items()):
        h.update(f"{os.path.relpath(p, d)}\0{info['xxh3_128']}\n".encode())
    return {"path": d, "kind": "tree", "tree": h.hexdigest(), "files": len(files)}


def make_phase(index: int, reason: str, code: str | None, data: list[str], recipe: list[str],
               total_steps: int | None) -> Phase:
    data_files = expand(data) if data else []
    return Phase(index=index, time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), reason=reason,
                 code=code_state(code) if code else None,
                 data={"paths": [os.path.abspath(p) for p in data], "files": hash_files(data_files)},
                 recipe={p: i["xxh3_128"] for p, i in hash_files(expand(recipe) if recipe else []).items()},
                 total_steps=total_steps)


# ---- the file -----------------------------------------------------------------------------------
def path_in(run_root: str) -> str:
    return os.path.join(run_root, NAME)


def load(path: str) -> Contract:
    try:
        raw = read_regular(path, MAX_BYTES)
        doc = json.loads(raw)
    except OSError as exc:
        raise ContractError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:
        raise ContractError(f"{path}: not JSON ({str(exc)[:80]})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("phases"), list) \
            or not doc["phases"]:
        raise ContractError(f"{path}: not a {FORMAT} file with at least one phase")
    phases = []
    for i, p in enumerate(doc["phases"]):
        try:
            ph = Phase(index=p["index"], time=str(p["time"]), reason=str(p["reason"]), code=p["code"],
                       data=p["data"], recipe=p["recipe"], total_steps=p["total_steps"])
            if ph.index != i or not isinstance(ph.data.get("files"), dict) or not isinstance(ph.recipe, dict) \
                    or not (ph.code is None or isinstance(ph.code, dict)) \
                    or not (ph.total_steps is None or isinstance(ph.total_steps, int)):
                raise TypeError
        except (KeyError, TypeError, AttributeError):
            raise ContractError(f"{path}: phase {i} is malformed") from None
        phases.append(ph)
    return Contract(path, phases, raw)


def _dump(phases: list[Phase]) -> bytes:
    return json.dumps({"format": FORMAT, "phases": [p.to_json() for p in phases]}, indent=1).encode()


def init(run_root: str, code: str | None, data: list[str], recipe: list[str], total_steps: int | None) -> Contract:
    from .io.atomic import write_new
    if not os.path.isdir(run_root):
        raise InputError(f"{run_root}: not a directory")
    path = path_in(run_root)
    if os.path.lexists(path):
        raise UsageError(f"{path} exists: a contract is never rewritten; use `ckptdoctor contract new-phase`")
    phase = make_phase(0, "initial", code, data, recipe, total_steps)
    try:
        write_new(path, _dump([phase]))
    except FileExistsError:
        raise UsageError(f"{path} exists (written meanwhile): use `ckptdoctor contract new-phase`") from None
    return Contract(path, [phase])


def new_phase(run_root: str, reason: str, code: str | None, data: list[str] | None, recipe: list[str] | None,
              total_steps: int | None) -> Contract:
    """Append a phase: what is given replaces the previous phase's, the rest carries over and is
    hashed afresh.  Earlier phases stay byte for byte as they were."""
    from .io.atomic import replace_file
    if not reason.strip():
        raise UsageError("--reason must say why the contract changes")
    c = load(path_in(run_root))
    last = c.newest
    phase = make_phase(len(c.phases), reason, code if code is not None else (last.code or {}).get("path"),
                       data if data is not None else last.data.get("paths", []),
                       recipe if recipe is not None else sorted(last.recipe),
                       total_steps if total_steps is not None else last.total_steps)
    doc = json.loads(c.raw)  # earlier phases are carried as they were read, unknown keys included
    doc["phases"].append(phase.to_json())
    replace_file(c.path, json.dumps(doc, indent=1).encode())
    c.phases.append(phase)
    return c


# ---- checking -----------------------------------------------------------------------------------
def compare(phase: Phase, total_steps: int | None = None, quick_data: bool = False) -> list[Change]:
    """What differs between `phase` and the disk now.  quick_data: re-hash only data files whose
    size or mtime changed (what preflight does; `contract check` re-hashes everything)."""
    out: list[Change] = []
    if phase.code:
        was = phase.code
        try:
            now = code_state(was["path"])
        except InputError:
            now = None
        if now is None:
            out.append(Change("code", was["path"], "removed", code_str(was), None))
        elif code_str(now) != code_str(was):
            out.append(Change("code", was["path"], "changed", code_str(was), code_str(now)))
    files = phase.data.get("files", {})
    try:
        present = expand([p for p in phase.data.get("paths", []) if os.path.exists(p)])
    except InputError:
        present = []
    for p in sorted(set(files) - set(present)):
        out.append(Change("data", p, "removed", files[p]["xxh3_128"], None))
    for p in sorted(set(present) - set(files)):
        out.append(Change("data", p, "added", None, "new file"))
    common = sorted(set(files) & set(present))
    if quick_data:
        def same_stat(p):
            s = os.stat(p)
            return s.st_size == files[p]["size"] and s.st_mtime_ns == files[p].get("mtime_ns")
        common = [p for p in common if not same_stat(p)]
    now = hash_files(common)
    for p in common:
        if now[p]["xxh3_128"] != files[p]["xxh3_128"]:
            out.append(Change("data", p, "changed", f"{files[p]['size']} bytes {files[p]['xxh3_128']}",
                              f"{now[p]['size']} bytes {now[p]['xxh3_128']}"))
    recipe_now = {}
    for p in phase.recipe:
        if os.path.isfile(p):
            recipe_now[p] = hash_files([p])[p]["xxh3_128"]
    for p, h in sorted(phase.recipe.items()):
        if p not in recipe_now:
            out.append(Change("recipe", p, "removed", h, None))
        elif recipe_now[p] != h:
            out.append(Change("recipe", p, "changed", h, recipe_now[p]))
    if total_steps is not None and total_steps != phase.total_steps:
        out.append(Change("total_steps", "total_steps", "changed", str(phase.total_steps), str(total_steps)))
    return out


def code_str(c: dict) -> str:
    if c.get("kind") == "git":
        return f"git {c.get('commit')}" + (f" + uncommitted {c['uncommitted']}" if c.get("uncommitted") else "")
    return f"tree {c.get('tree')} ({c.get('files')} files)"
