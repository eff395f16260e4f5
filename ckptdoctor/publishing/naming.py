"""Names publish uses: its own temp/trash names (rules/publish.yaml) and, from the family
descriptions, which family a checkpoint name belongs to, its tracker and its staging siblings."""
from __future__ import annotations

import os
import re
from functools import lru_cache

from ..engine.catalog import data_dir, load_yaml
from ..engine.errors import UsageError
from ..layouts import spec, trackers
from ..layouts.spec import Layout


@lru_cache(maxsize=1)
def config() -> dict:
    return load_yaml(data_dir() / "publish.yaml")


def choose_layout(option: str, name: str, existing_files: set[str]) -> Layout | None:
    """The run layout (family) `name` is published under.  --tracker none: None; --tracker FAMILY:
    that family, whose step naming must match `name`; auto: a family whose step naming matches
    `name`, preferring one whose tracker file already exists in DEST_ROOT, then one that writes a
    tracker, then the higher priority."""
    if option == "none":
        return None
    if option != "auto":
        lay = spec.for_tracker_option(option)
        if not lay.steps.matches(name):
            raise UsageError(f"--tracker {option}: checkpoint name {name!r} does not match "
                             f"{lay.steps.pattern.pattern}")
        return lay
    matching = [l for l in spec.run_layouts() if l.steps.matches(name) and not l.steps.files]   # publish makes directories
    if not matching:
        return None

    def rank(l: Layout):
        t = l.tracker
        return (bool(t and t.file in existing_files), bool(t and t.content), l.priority)
    return max(matching, key=rank)


def tracker_target(layout: Layout, text: bytes) -> str | None:
    """The checkpoint directory an existing tracker names, parsed the framework's way."""
    return trackers.parse(layout, text).target


def staging_for(layout: Layout | None, name: str, entries: list[str]) -> list[str]:
    pats = [p.format(name=name) for p in config()["staging_siblings"]]
    step = layout.steps.step(name) if layout else None
    if step is not None:
        pats += list(layout.staging_for(step))
    return [e for e in entries if e != name and spec.match_any(e, tuple(pats))]


# os.uname().nodename is gethostname() on Linux, without importing socket (2.5 ms of start-up)
HOST = os.uname().nodename.replace("-", "_") or "host"
# A checkpoint name: one plain ASCII directory name (no trailing newline, no non-ASCII digits, no
# path separators, not hidden); full match, so Python's `$`-before-newline cannot slip one through.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]{0,254}", re.ASCII)


def check_name(name: str) -> None:
    from ..layouts import manifest as mf
    if not NAME_RE.fullmatch(name or ""):
        raise UsageError(f"--name {name!r}: a checkpoint name is one ASCII directory name (letters, digits, "
                         f"'._+=-', not starting with a dot)")
    if name in tracker_files() | {mf.NAME, mf.INTEGRITY, in_progress_object(), LOCK_FILE} or \
            any(name == l.tracker.file for l in spec.run_layouts() if l.tracker):
        raise UsageError(f"--name {name!r}: that is the name of a tracker or marker file; publishing a "
                         f"checkpoint there would replace it")


def _proc_stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (state first, start time at 19), or
    None where there is no such process or no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc), which tells a live process from
    a new one that reused its pid."""
    fields = _proc_stat(pid)
    return fields[19].decode() if fields else None


_START = start_time(os.getpid()) or "0"


def temp_name(name: str) -> str:
    return config()["temp_dir"].format(name=name, host=HOST, pid=f"{os.getpid()}.{_START}",
                                       nonce=os.urandom(3).hex())


def trash_name(name: str) -> str:
    return config()["trash_dir"].format(name=name, host=HOST, pid=f"{os.getpid()}.{_START}",
                                        nonce=os.urandom(3).hex())


_OWN = re.compile(r"^\.(?P<name>.+)\.ckptdoctor-(?P<kind>tmp|trash)-(?P<host>[^-]+)-(?P<pid>[0-9]+)"
                  r"(?:\.(?P<start>[0-9]+))?-[0-9a-f]+$")


def parse_own(dirname: str) -> dict | None:
    m = _OWN.match(dirname)
    return m.groupdict() if m else None


_PARTS = re.compile(r"^\.(?P<name>.+)\.ckptdoctor-parts-(?P<id>[A-Za-z0-9][A-Za-z0-9._=+-]{0,63})$")


def parse_parts(dirname: str) -> dict | None:
    """{name, id} of a part publish's shared staging directory (publish --part), else None."""
    m = _PARTS.match(dirname)
    return m.groupdict() if m else None


def pid_alive(pid: int, start: str | None = None) -> bool:
    """Is that process (pid, and start time when recorded) still running on this host?  A zombie
    is not: a committer SIGKILLed after its rename stays one until its parent reaps it, and a part
    waiting for its after-commit would otherwise wait out --timeout (seen in CI)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _proc_stat(pid)
    if fields is None:
        return True   # no /proc: kill(2) answered, and it cannot tell a reused pid
    if fields[0] in (b"Z", b"X"):
        return False
    return start is None or fields[19].decode() == start


def owner_alive(own: dict) -> bool:
    return own["host"] == HOST and pid_alive(int(own["pid"]), own.get("start"))


LOCK_FILE = ".ckptdoctor-lock"


def tracker_files() -> set[str]:
    return {l.tracker.file for l in spec.run_layouts() if l.tracker and l.tracker.content}


def in_progress_object() -> str:
    return config()["in_progress_object"]
