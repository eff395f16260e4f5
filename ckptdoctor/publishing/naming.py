"""Names publish uses (temp, trash, tracker formats), loaded from rules/publish.yaml."""
from __future__ import annotations

import fnmatch
import os
import re
import secrets
import socket
from dataclasses import dataclass
from functools import lru_cache

from ..engine.catalog import data_dir, load_yaml
from ..engine.errors import UsageError


@dataclass(frozen=True)
class TrackerFormat:
    name: str
    file: str | None
    dir_re: re.Pattern
    content: str | None

    def step_of(self, dirname: str) -> int | None:
        m = self.dir_re.match(dirname)
        if not m:
            return None
        s = m.groupdict().get("step")
        return int(s) if s is not None else None

    def render(self, dirname: str) -> str:
        m = self.dir_re.match(dirname)
        vals = {k: (str(int(v)) if k == "step" else v) for k, v in m.groupdict().items() if v is not None}
        return self.content.format(**vals)

    def parse(self, text: str) -> int | None:
        """The step an existing tracker names (None when it is not a step, e.g. 'release')."""
        t = text.strip()
        if self.content == "{step}":
            return int(t) if t.isdigit() else None
        m = self.dir_re.match(t)
        return self.step_of(t) if m else None

    def dir_for(self, text: str, candidates: list[str]) -> str | None:
        step = self.parse(text)
        for c in candidates:
            if self.content == "{tag}" and c == text.strip():
                return c
            if step is not None and self.step_of(c) == step:
                return c
        return None


@lru_cache(maxsize=1)
def config() -> dict:
    return load_yaml(data_dir() / "publish.yaml")


def formats() -> dict[str, TrackerFormat]:
    return {k: TrackerFormat(k, v.get("file"), re.compile(v["dir"]), v.get("content"))
            for k, v in config()["trackers"].items()}


def choose_format(option: str, name: str, existing_files: set[str]) -> TrackerFormat | None:
    """--tracker none|auto|FORMAT.  auto: a format whose directory pattern matches `name`,
    preferring one whose tracker file already exists in DEST_ROOT."""
    fmts = formats()
    if option == "none":
        return None
    if option != "auto":
        f = fmts.get(option)
        if f is None:
            raise UsageError(f"--tracker {option!r}: use none, auto or one of {', '.join(fmts)}")
        if not f.dir_re.match(name):
            raise UsageError(f"--tracker {option}: checkpoint name {name!r} does not match {f.dir_re.pattern}")
        return f
    matching = [f for f in fmts.values() if f.dir_re.match(name)]
    with_file = [f for f in matching if f.file and f.file in existing_files]
    return (with_file or matching or [None])[0]


HOST = socket.gethostname().replace("-", "_") or "host"


def temp_name(name: str) -> str:
    return config()["temp_dir"].format(name=name, host=HOST, pid=os.getpid(), nonce=secrets.token_hex(3))


def trash_name(name: str) -> str:
    return config()["trash_dir"].format(name=name, host=HOST, pid=os.getpid(), nonce=secrets.token_hex(3))


_OWN = re.compile(r"^\.(?P<name>.+)\.ckptdoctor-(?P<kind>tmp|trash)-(?P<host>[^-]+)-(?P<pid>\d+)-[0-9a-f]+$")


def parse_own(dirname: str) -> dict | None:
    m = _OWN.match(dirname)
    return m.groupdict() if m else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def staging_for(name: str, entries: list[str]) -> list[str]:
    pats = [p.format(name=name) for p in config()["staging_siblings"]]
    return [e for e in entries if e != name and any(fnmatch.fnmatchcase(e, p) for p in pats)]


def in_progress_object() -> str:
    return config()["in_progress_object"]
