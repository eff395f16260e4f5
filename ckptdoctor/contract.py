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
    files: tuple[str, ...] = ()   # code: the files that differ; recipe: the unified diff's lines


@value
class Phase:
    index: int
    time: str
    reason: str
    code: dict | None
    data: dict          # {"paths": [...], "files": {path: {"size", "xxh3_128", "mtime_ns"}}}
    recipe: dict        # {path: hash}
    total_steps: int | None
    recipe_text: dict = field(default_factory=dict)   # {path: text} of small UTF-8 recipes: the diff a finding shows

    def body(self) -> dict:
        d = {"index": self.index, "time": self.time, "reason": self.reason, "code": self.code,
             "data": self.data, "recipe": self.recipe, "total_steps": self.total_steps}
        if self.recipe_text:
            d["recipe_text"] = self.recipe_text
        return d

    def to_json(self) -> dict:
        """The phase as written, with a digest of its own content: a hand edit of any field (a recipe
        removed from the newest phase, a hash pasted in) no longer matches it (CKD510)."""
        return {**self.body(), "digest": phase_digest(self.body())}


def phase_digest(body: dict) -> str:
    return xxhash.xxh3_128(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


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
        units += hashing.units_for(p.lstrip("/"), s.st_size)   # one unit even for an empty file
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


def expand(paths: list[str], links: dict | None = None) -> list[str]:
    """Files named, and every regular file under directories named (sorted, absolute).  Symlinked
    directories are followed (the files are recorded by their path through the link, and the link
    itself in `links` as path -> target), so data behind a link is hashed like any other; a link
    that leads back into its own ancestors is a cycle and refused, naming it."""
    out = []
    for p in paths:
        p = os.path.abspath(p)
        if os.path.isdir(p):
            chain = {p: (os.path.realpath(p),)}   # dirpath -> the real directories the walk passed to reach it
            for dirpath, dirnames, filenames in os.walk(p, followlinks=True):
                above = chain.pop(dirpath, (os.path.realpath(dirpath),))
                keep = []
                for d in sorted(dirnames):
                    if d in SKIP_DIRS:
                        continue
                    full = os.path.join(dirpath, d)
                    target = os.path.realpath(full)
                    if os.path.islink(full):
                        if target in above:
                            raise InputError(f"{full}: a symlink cycle (it leads back to {target}); refused")
                        if links is not None:
                            links[full] = target
                    chain[full] = above + (target,)
                    keep.append(d)
                dirnames[:] = keep
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


MAX_CODE_FILES = 10_000   # uncommitted files listed by name in the contract (beyond: counted)


def code_state(d: str, scheme: int = 2, depth: int = 0) -> dict:
    """git commit plus the uncommitted state, or a tree hash of every file outside git.

    Scheme 2 (written since issue 37): each changed or untracked file by its own content, from
    `git status --porcelain -z` (a format no user config changes: not `git diff` text, whose prefixes
    diff.noprefix and diff.mnemonicPrefix change), and every nested repository and submodule that
    git lists as changed by its own commit and uncommitted state, recursively.  Scheme 1 (contracts
    written before) hashed `git diff HEAD` and is still computed to compare with them."""
    d = os.path.abspath(d)
    if not os.path.isdir(d):
        raise InputError(f"--code {d}: not a directory")
    head = _git(d, "rev-parse", "HEAD")
    if head is not None and scheme >= 2:
        files = _dirty_files(d, depth)
        dirty = None
        if files:
            h = xxhash.xxh3_128()
            for path, state in sorted(files.items()):
                h.update(f"{path}\0{state}\n".encode("utf-8", "surrogateescape"))
            dirty = h.hexdigest()
        out = {"path": d, "kind": "git", "scheme": 2, "commit": head.decode().strip(), "uncommitted": dirty}
        if files:
            out["uncommitted_files"] = dict(sorted(files.items())[:MAX_CODE_FILES])
            out["uncommitted_count"] = len(files)
        return out
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


def _dirty_files(d: str, depth: int) -> dict[str, str]:
    """{path: state} of every changed, deleted or untracked file of the repository at d (content
    digests), nested repositories and submodules by their own state."""
    if depth > 8:
        raise InputError(f"{d}: repositories nested more than 8 deep")
    raw = _git(d, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignore-submodules=none",
               "--no-renames")
    if raw is None:
        raise InputError(f"--code {d}: `git status` failed")
    files: dict[str, str] = {}
    for ent in (e for e in raw.split(b"\0") if len(e) >= 4):   # "XY path" (not the empty piece after the final NUL)
        xy, path = ent[:2].decode("ascii", "replace"), os.fsdecode(ent[3:])
        full = os.path.join(d, path)
        if os.path.isdir(full) and not os.path.islink(full):
            if os.path.lexists(os.path.join(full, ".git")):    # a submodule or a nested repository
                files[path.rstrip("/")] = "repo " + code_str(code_state(full, 2, depth + 1))
            else:
                for f in expand([full]):
                    files[os.path.relpath(f, d)] = f"{xy.strip()} {hash_files([f])[f]['xxh3_128']}"
        elif os.path.islink(full):
            files[path] = f"{xy.strip()} link {os.readlink(full)}"
        elif os.path.isfile(full):
            files[path] = f"{xy.strip()} {hash_files([full])[full]['xxh3_128']}"
        else:
            files[path] = f"{xy.strip()} deleted"
    return files


RECIPE_TEXT_MAX = 64 << 10


def _recipe_text(paths: list[str]) -> dict[str, str]:
    out = {}
    for p in paths:
        try:
            if os.path.getsize(p) <= RECIPE_TEXT_MAX:
                out[p] = read_regular(p, RECIPE_TEXT_MAX).decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return out


def make_phase(index: int, reason: str, code: str | None, data: list[str], recipe: list[str],
               total_steps: int | None) -> Phase:
    links: dict[str, str] = {}
    data_files = expand(data, links) if data else []
    recipe_files = expand(recipe) if recipe else []
    d = {"paths": [os.path.abspath(p) for p in data], "files": hash_files(data_files)}
    if links:
        d["links"] = links
    return Phase(index=index, time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), reason=reason,
                 code=code_state(code) if code else None, data=d,
                 recipe={p: i["xxh3_128"] for p, i in hash_files(recipe_files).items()},
                 total_steps=total_steps, recipe_text=_recipe_text(recipe_files))


# ---- the file -----------------------------------------------------------------------------------
def path_in(run_root: str) -> str:
    return os.path.join(run_root, NAME)


def load(path: str) -> Contract:
    try:
        raw = read_regular(path, MAX_BYTES)
    except OSError as exc:
        raise ContractError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except ValueError:   # over the limit (it was reported as "not JSON", quoting the path)
        raise ContractError(f"{path}: larger than the {MAX_BYTES}-byte limit for a contract") from None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ContractError(f"{path}: not JSON ({str(exc)[:80]})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("phases"), list) \
            or not doc["phases"]:
        raise ContractError(f"{path}: not a {FORMAT} file with at least one phase")
    phases = []
    signed = False
    for i, p in enumerate(doc["phases"]):
        try:
            ph = Phase(index=p["index"], time=str(p["time"]), reason=str(p["reason"]), code=p["code"],
                       data=p["data"], recipe=p["recipe"], total_steps=p["total_steps"],
                       recipe_text=p.get("recipe_text") or {})
            if ph.index != i or not isinstance(ph.data.get("files"), dict) or not isinstance(ph.recipe, dict) \
                    or not (ph.code is None or isinstance(ph.code, dict)) \
                    or not (ph.total_steps is None or isinstance(ph.total_steps, int)) \
                    or not isinstance(ph.recipe_text, dict):
                raise TypeError
        except (KeyError, TypeError, AttributeError):
            raise ContractError(f"{path}: phase {i} is malformed") from None
        if "digest" in p:   # every phase written since issue 37 carries one
            signed = True
            if p["digest"] != phase_digest({k: v for k, v in p.items() if k != "digest"}):
                raise ContractError(f"{path}: phase {i} was edited by hand (its content no longer matches its "
                                    f"digest); a contract changes only through `ckptdoctor contract new-phase`")
        elif signed:
            raise ContractError(f"{path}: phase {i} has no digest although an earlier one has: edited by hand")
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
            now = code_state(was["path"], scheme=int(was.get("scheme") or 1))
        except InputError:
            now = None
        if now is None:
            out.append(Change("code", was["path"], "removed", code_str(was), None))
        elif code_str(now) != code_str(was):
            out.append(Change("code", was["path"], "changed", code_str(was), code_str(now),
                              tuple(_code_files(was, now))))
    files = phase.data.get("files", {})
    for link, target in sorted((phase.data.get("links") or {}).items()):
        now_t = os.path.realpath(link) if os.path.islink(link) else None
        if now_t != target:
            out.append(Change("data", link, "changed" if now_t else "removed", f"link to {target}",
                              f"link to {now_t}" if now_t else None))
    present = []
    for path in phase.data.get("paths", []):   # one by one: a path turned into a FIFO or a symlink
        if os.path.exists(path):                # cycle loses its own files, not every path's
            try:
                present += expand([path])
            except InputError:
                pass
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
            out.append(Change("recipe", p, "changed", h, recipe_now[p], tuple(_recipe_diff(phase, p))))
    if total_steps is not None and total_steps != phase.total_steps:
        out.append(Change("total_steps", "total_steps", "changed", str(phase.total_steps), str(total_steps)))
    return out


def _code_files(was: dict, now: dict) -> list[str]:
    """The code files that differ: between the two commits (git's own list), and among the
    uncommitted files recorded then and found now."""
    out = []
    if was.get("kind") == "git" and now.get("kind") == "git" and was.get("commit") != now.get("commit"):
        names = _git(was["path"], "diff", "--name-only", "-z", "--no-renames", was["commit"], now["commit"])
        out += [os.fsdecode(n) for n in (names or b"").split(b"\0") if n][:100]
    a, b = was.get("uncommitted_files") or {}, now.get("uncommitted_files") or {}
    out += [f"{p} (uncommitted)" for p in sorted(set(a) | set(b)) if a.get(p) != b.get(p)][:100]
    return out


def _recipe_diff(phase: Phase, path: str) -> list[str]:
    import difflib
    old = phase.recipe_text.get(path)
    if old is None:
        return []
    try:
        new = read_regular(path, RECIPE_TEXT_MAX).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), "recorded", "now", n=0, lineterm="")
    return [ln for ln in lines if ln[:1] in "+-" and not ln.startswith(("+++", "---"))][:40]


def code_str(c: dict) -> str:
    if c.get("kind") == "git":
        return f"git {c.get('commit')}" + (f" + uncommitted {c['uncommitted']}" if c.get("uncommitted") else "")
    return f"tree {c.get('tree')} ({c.get('files')} files)"
