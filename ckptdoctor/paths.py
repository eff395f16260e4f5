"""Where the installed man pages, shell completions and Slurm scripts are (`ckptdoctor paths`).

A wheel installs them under the environment's data prefix (`sysconfig.get_path("data")`, e.g.
/usr/local or the venv): share/man/man1, share/bash-completion/completions, share/zsh/site-functions,
share/fish/vendor_completions.d, share/ckptdoctor/slurm.  A source checkout has them beside the
package (man/, completions/, scripts/slurm/).
"""
from __future__ import annotations

import sysconfig
from .values import value
from pathlib import Path

INSTALLED = {"man": "share/man/man1", "bash": "share/bash-completion/completions/ckptdoctor",
             "zsh": "share/zsh/site-functions/_ckptdoctor", "fish": "share/fish/vendor_completions.d/ckptdoctor.fish",
             "slurm": "share/ckptdoctor/slurm"}
SOURCE = {"man": "man", "bash": "completions/ckptdoctor.bash", "zsh": "completions/_ckptdoctor",
          "fish": "completions/ckptdoctor.fish", "slurm": "scripts/slurm"}


@value(frozen=True)
class Place:
    what: str
    path: str
    exists: bool


def places() -> list[Place]:
    data = Path(sysconfig.get_path("data"))
    src = Path(__file__).resolve().parent.parent
    out = []
    for what in INSTALLED:
        cands = [data / INSTALLED[what], src / SOURCE[what]]
        probe = (lambda c: (c / "ckptdoctor.1").is_file()) if what == "man" else (lambda c: c.exists())
        hit = next((c for c in cands if probe(c)), None)
        out.append(Place(what, str(hit or cands[0]), hit is not None))
    return out


def manpath() -> str | None:
    """The directory to add to MANPATH (the parent of man1), if the pages are installed."""
    p = next(p for p in places() if p.what == "man")
    return str(Path(p.path).parent) if p.exists and Path(p.path).name == "man1" else None


def activation(shell: str) -> str | None:
    """The line that enables completion for `shell` from wherever this install keeps it (a venv's
    share/ is not on bash-completion's, zsh's or fish's search path)."""
    import shlex
    p = next(p for p in places() if p.what == shell)
    if not p.exists:
        return None
    q = shlex.quote(p.path)
    if shell == "zsh":
        d = shlex.quote(str(Path(p.path).parent))
        return f"fpath=({d} $fpath); autoload -Uz compinit && compinit -i"
    return f"source {q}"
