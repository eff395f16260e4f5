#!/usr/bin/env python3
"""Generate man/*.1 and completions/* from the typer CLI definition.

    python scripts/gen_docs.py          # rewrite the files
    python scripts/gen_docs.py --check  # exit 1 if any generated file is stale (used by the tests)

Our own roff writer walks the click command tree (typer >= 0.26 vendors click, so click-man
would silently drop every option).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import typer  # noqa: E402
from typer._completion_shared import get_completion_script  # noqa: E402

from ckptdoctor import __version__  # noqa: E402
from ckptdoctor.cli import app  # noqa: E402
from ckptdoctor.engine.errors import EXIT_CODES  # noqa: E402

DATE = "2026"


def esc(s: str) -> str:
    s = s.replace("\\", "\\\\").replace("-", "\\-")
    return "\n".join(("\\&" + l) if l.startswith((".", "'")) else l for l in s.splitlines())


def opt_line(p) -> tuple[str, str]:
    names = ", ".join(f"\\fB{esc(o)}\\fR" for o in p.opts + p.secondary_opts)
    if not p.is_flag and getattr(p, "type", None) is not None:
        choices = getattr(p.type, "choices", None)
        meta = "|".join(str(c.value if hasattr(c, "value") else c) for c in choices) if choices else \
            p.type.name.upper()
        names += f" \\fI{esc(meta)}\\fR"
    return names, esc(p.help or "")


def page(name: str, summary: str, synopsis: str, desc: str, params, extra: str = "") -> str:
    out = [f'.TH "{name.upper()}" "1" "{DATE}" "ckptdoctor {__version__}" "User Commands"',
           ".SH NAME", f"{esc(name)} \\- {esc(summary)}", ".SH SYNOPSIS", esc(synopsis),
           ".SH DESCRIPTION", esc(desc)]
    args = [p for p in params if p.param_type_name == "argument"]
    opts = [p for p in params if p.param_type_name == "option"]
    if args:
        out.append(".SH ARGUMENTS")
        for a in args:
            out += [".TP", f"\\fI{esc(a.name.upper())}\\fR", esc(getattr(a, "help", "") or "")]
    if opts:
        out.append(".SH OPTIONS")
        for o in opts:
            n, h = opt_line(o)
            out += [".TP", n, h]
    out.append(extra)
    return "\n".join(x for x in out if x) + "\n"


EXIT = ".SH EXIT STATUS\n" + "\n".join(f".TP\n\\fB{c}\\fR\n{esc(t)}" for c, t in EXIT_CODES.items())
FILES = """.SH FILES
.TP
\\fIckptdoctor.toml\\fR, \\fI.ckptdoctor.toml\\fR, \\fIpyproject.toml\\fR [tool.ckptdoctor]
Configuration, found upward from the current directory (closest wins); or \\fB$CKPTDOCTOR_CONFIG\\fR, or \\fB\\-\\-config\\fR.
.TP
\\fIrules/CKD*.yaml\\fR, \\fIrules/layouts/*.yaml\\fR
The rule catalog and the checkpoint layout descriptions shipped with ckptdoctor.
.SH ENVIRONMENT
.TP
\\fBNO_COLOR\\fR
Disable colour in text output.
.TP
\\fBCKPTDOCTOR_CONFIG\\fR
Config file to use when \\fB\\-\\-config\\fR is not given.
"""


# The README's examples, per page (kept here so every page has an EXAMPLES section; the docs test
# checks each page has one).
EXAMPLES = {
    "ckptdoctor": ["ckptdoctor demo", "ckptdoctor verify /scratch/run7", "ckptdoctor rules CKD104"],
    "verify": ["ckptdoctor verify /scratch/run7                    # a run root: what resumes, what is broken",
               "ckptdoctor verify /scratch/run7/iter_0000300       # one checkpoint directory",
               "ckptdoctor verify s3://bucket/run7 --format json   # any fsspec URL",
               "ckptdoctor verify --checksums --slice $SLURM_PROCID/$SLURM_NTASKS /scratch/run7/iter_0000300",
               "ckptdoctor verify --target resume /scratch/run7 || exit 1   # the relaunch gate: exit 1 = do not resume",
               "ckptdoctor verify --fix --dry-run /scratch/run7   # what --fix would repair (tracker, leftovers)",
               "ckptdoctor verify --fix /scratch/run7             # repair under the run's lock, then judge again"],
    "manifest": ["ckptdoctor manifest /scratch/run7/iter_0000300"],
    "merge": ["ckptdoctor merge slice-*.json"],
    "publish": ["ckptdoctor publish /nvme/run7/iter_0000300 /lustre/run7",
                "ckptdoctor publish --keep-last 3 --keep-every 1000 /nvme/run7/iter_0000300 /lustre/run7",
                "ckptdoctor publish /nvme/run7/iter_0000300 s3://bucket/run7"],
    "reconcile": ["ckptdoctor reconcile /ckpts/grpo/step_7", "ckptdoctor reconcile --simulate /ckpts/grpo/step_7",
                  "ckptdoctor reconcile --fix /ckpts/grpo/step_7"],
    "preflight": ["ckptdoctor preflight '/nvme/{node}/run7' --nodelist 'gpu[001-004]' --ranks-per-node 8",
                  "ckptdoctor preflight --local /nvme/run7      # in a job's first step, on each node"],
    "forensics": ["ckptdoctor forensics slurm-4242.out             # the first failure across ranks, its class",
                  "ckptdoctor forensics slurm-4242-*.out --run-root /lustre/run7   # and the checkpoint it names",
                  "ckptdoctor forensics logs/attempt_0/*/stderr.log dmesg.txt --format json"],
    "rules": ["ckptdoctor rules", "ckptdoctor rules CKD104", "ckptdoctor rules --format json"],
    "layouts": ["ckptdoctor layouts", "ckptdoctor layouts --format json"],
    "paths": ["ckptdoctor paths", "ckptdoctor paths --format json"],
    "prune": ["ckptdoctor prune --keep-last 3 --dry-run /lustre/run7",
              "ckptdoctor prune --keep-last 3 --keep-every 1000 /lustre/run7"],
    "schema": ["ckptdoctor schema report > ckptdoctor-report.schema.json", "ckptdoctor schema run-state"],
    "demo": ["ckptdoctor demo", "ckptdoctor demo /tmp/ckptdoctor-demo"],
    "contract init": ["ckptdoctor contract init /lustre/run7 --code ~/train --data /data/tokens --recipe "
                      "recipes/llama.yaml --total-steps 100000"],
    "contract check": ["ckptdoctor contract check /lustre/run7 --total-steps 100000"],
    "contract new-phase": ["ckptdoctor contract new-phase /lustre/run7 --reason 'lower LR after loss spike' "
                           "--recipe recipes/llama-lr2.yaml"],
    "digests diff": ["ckptdoctor digests diff /lustre/run7/iter_0000300 /lustre/run7-replay/iter_0000300"],
}


def first_sentence(help_text: str) -> str:
    """The NAME line: the help's first sentence, whole (typer's first line can stop mid-sentence)."""
    para = " ".join(help_text.split("\n\n", 1)[0].split())
    m = re.search(r"(?<=[.?!])\s", para)
    return para[:m.start()] if m else para


def examples(name: str) -> str:
    lines = EXAMPLES.get(name)
    if not lines:
        raise SystemExit(f"gen_docs: no EXAMPLES for {name}: add them to EXAMPLES")
    return ".SH EXAMPLES\n" + "\n".join(f".PP\n.nf\n{esc(x)}\n.fi" for x in lines)


def generate() -> dict[str, str]:
    cmd = typer.main.get_command(app.build())
    files: dict[str, str] = {}
    subs = cmd.commands
    top_desc = ("ckptdoctor finds broken checkpoints before a relaunch and publishes them whole or not at "
                "all. Subcommands: " + ", ".join(subs) + ". Each has its own page, e.g. ckptdoctor\\-verify(1).")
    leaves = []
    for sname, sub in subs.items():  # a group (contract, digests) has one page per subcommand
        leaves += [(f"{sname} {n}", c) for n, c in sub.commands.items()] if hasattr(sub, "commands") \
            else [(sname, sub)]
    files["man/ckptdoctor.1"] = page("ckptdoctor", cmd.help.splitlines()[0], "ckptdoctor [--version] COMMAND [ARGS]...",
                                     top_desc, cmd.params, examples("ckptdoctor") + "\n" + EXIT + "\n" + FILES +
                                     "\n.SH SEE ALSO\n" +
                                     ", ".join(f"ckptdoctor\\-{n.replace(' ', '-')}(1)" for n, _ in leaves))
    for sname, sub in leaves:
        synopsis = f"ckptdoctor {sname} [OPTIONS]" + "".join(
            f" {p.name.upper()}" for p in sub.params if p.param_type_name == "argument")
        dashed = sname.replace(" ", "-")
        files[f"man/ckptdoctor-{dashed}.1"] = page(f"ckptdoctor-{dashed}", first_sentence(sub.help or ""),
                                                   synopsis, sub.help or "", sub.params,
                                                   examples(sname) + "\n" + EXIT + "\n.SH SEE ALSO\nckptdoctor(1)")
    for shell, fname in (("bash", "completions/ckptdoctor.bash"), ("zsh", "completions/_ckptdoctor"),
                         ("fish", "completions/ckptdoctor.fish")):
        files[fname] = get_completion_script(prog_name="ckptdoctor", complete_var="_CKPTDOCTOR_COMPLETE",
                                             shell=shell).rstrip() + "\n"
    # what start-up reads instead of typer and the YAML parser (shipped in the package; issue 38)
    from ckptdoctor import fastcli
    from ckptdoctor.engine import yamlcache
    files["ckptdoctor/_cli_spec.json"] = json.dumps(fastcli.compile_spec(app), sort_keys=True,
                                                    separators=(",", ":")) + "\n"
    files["ckptdoctor/_compiled_rules.json"] = yamlcache.compile_all(ROOT / "rules")
    files["ckptdoctor/_values_code.py"] = values_code()
    return files


VALUES_PROBE = """
import importlib, pkgutil, sys
for opt in ("torch", "numpy", "isal", "s3fs", "gcsfs", "paramiko", "jax", "deepspeed", "transformers"):
    sys.modules[opt] = None   # the same classes whatever optional library this environment has
import ckptdoctor
from ckptdoctor import values
for m in sorted(pkgutil.walk_packages(ckptdoctor.__path__, "ckptdoctor."), key=lambda m: m.name):
    if not m.name.endswith(("__main__", "_values_code")):
        try:
            importlib.import_module(m.name)
        except ImportError:
            pass
sys.stdout.write(values.shipped_module(values.SEEN))
"""


def values_code() -> str:
    """Every value class's generated methods: a fresh interpreter imports every module of the package
    (with the optional libraries blocked, so every environment generates the same), then ships what
    values.py generated."""
    import subprocess
    return subprocess.run([sys.executable, "-c", VALUES_PROBE], capture_output=True, text=True, check=True,
                          cwd=ROOT).stdout


def main(argv) -> int:
    files = generate()
    stale = [f for f, text in files.items() if not (ROOT / f).is_file() or (ROOT / f).read_text() != text]
    if "--check" in argv:
        if stale:
            print("stale generated files (run python scripts/gen_docs.py): " + ", ".join(stale))
            return 1
        return 0
    for f, text in files.items():
        (ROOT / f).parent.mkdir(exist_ok=True)
        (ROOT / f).write_text(text)
    print(f"wrote {len(files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
