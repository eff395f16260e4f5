"""Registry of check functions: one small function per rule id.

A check is registered with the scope it runs on:
  * "checkpoint": fn(ckpt: CheckpointView, ctx) -> Iterable[Hit]
  * "run":        fn(run: RunView, ctx) -> Iterable[Hit]
  * other scopes belong to their subcommand (e.g. "reconcile", "preflight", "publish").
"""
from __future__ import annotations

import importlib
from ..values import value
TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Callable

CHECK_MODULES = (
    "ckptdoctor.checks.verify_markers",
    "ckptdoctor.checks.verify_dcp",
    "ckptdoctor.checks.verify_layout",
    "ckptdoctor.checks.verify_safetensors",
    "ckptdoctor.checks.verify_components",
    "ckptdoctor.checks.verify_trackers",
    "ckptdoctor.checks.verify_checksums",
    "ckptdoctor.checks.verify_deep",
    "ckptdoctor.checks.verify_publish",
    "ckptdoctor.checks.reconcile",
    "ckptdoctor.checks.preflight",
    "ckptdoctor.checks.resume",
    "ckptdoctor.checks.forensics",
    "ckptdoctor.checks.tool",
)


# Which subcommands run the checks of each scope (publish verifies its source checkpoint), and
# which subcommands offer the options that switch a check on.  A rule's `subcommands` in the
# catalog is tested against what this derives (tests/test_catalog.py).
SCOPE_COMMANDS = {"checkpoint": ("verify", "publish"), "run": ("verify",), "reconcile": ("reconcile",),
                  "preflight": ("preflight",), "contract": ("contract", "preflight"), "digests": ("digests",),
                  "forensics": ("forensics",)}
OPTION_COMMANDS = {"checksums": ("verify",), "deep": ("verify",)}


@value(frozen=True)
class Check:
    rule: str
    scope: str
    fn: Callable
    option: str | None = None                  # an engine option that must be set for it to fire
    commands: tuple[str, ...] | None = None    # external rules: the subcommands that emit them

    @property
    def subcommands(self) -> tuple[str, ...]:
        if self.commands is not None:
            return self.commands
        cmds = SCOPE_COMMANDS.get(self.scope, ())
        if self.option:
            cmds = tuple(c for c in cmds if c in OPTION_COMMANDS[self.option])
        return cmds


_REGISTRY: dict[str, Check] = {}


def check(rule_id: str, scope: str, option: str | None = None, commands: tuple[str, ...] | None = None):
    def deco(fn):
        if rule_id in _REGISTRY:
            raise RuntimeError(f"rule {rule_id} registered twice")
        _REGISTRY[rule_id] = Check(rule_id, scope, fn, option, commands)
        return fn
    return deco


def register_external(rule_id: str, commands: tuple[str, ...]):
    """For rules whose finding is raised by a subcommand's own flow (tool errors)."""
    return check(rule_id, "tool", commands=commands)(lambda *a, **k: ())


def load_all() -> dict[str, Check]:
    for mod in CHECK_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                raise
    return _REGISTRY


def checks_for(scope: str) -> list[Check]:
    load_all()
    return [c for c in _REGISTRY.values() if c.scope == scope]
