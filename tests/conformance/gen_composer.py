"""Generator: MosaicML Composer checkpoints written by Composer, damaged, labelled by its own autoresume.

    python tests/conformance/gen_composer.py [--out tests/fixtures/real/composer]

Needs mosaicml (the `composer` pin of the `conformance` extra; it pulls its own torch and torchvision,
so run it in a venv of its own).  It trains a tiny classifier for 4 batches on the CPU with
`save_interval="2ba"` and `autoresume=True` (`ep0-ba2-rank0.pt`, `ep0-ba4-rank0.pt` and the relative
symlink `latest-rank0.pt`), then for every damage case copies the save_folder, damages it and runs
the same Trainer to batch 6 in a fresh process.  What the resume did:

  loads          training began at the batch the link's target holds, and the run finished
  fresh-start    training began at batch 0 without an error (the run's progress is lost, silently)
  raises         the resume (or the run it resumed) raised: type and text recorded
"""
from __future__ import annotations

import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import damage  # noqa: E402

B2, B4, LINK = "ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt", "latest-rank0.pt"


def cases() -> list[dict]:
    return [
        {"name": "healthy", "ops": [], "names": None, "want": 4},
        {"name": "link-deleted", "ops": [["delete", LINK]], "names": LINK, "want": 4},
        {"name": "link-deleted-save-overwrite", "ops": [["delete", LINK]], "names": LINK, "want": 4,
         "load": {"save_overwrite": True}},
        {"name": "link-dangling", "ops": [["delete", B4]], "names": LINK, "want": 4},
        {"name": "link-outside-run", "ops": [["link", LINK, "../elsewhere/" + B4]], "names": LINK, "want": 4},
        {"name": "target-truncated", "ops": [["truncate", B4]], "names": B4, "want": 4},
        {"name": "older-truncated", "ops": [["truncate", B2]], "names": None, "want": 4},
        {"name": "link-copied-as-file", "ops": [["deref", LINK]], "names": None, "want": 4},
        {"name": "link-at-older", "ops": [["link", LINK, B2]], "names": B4, "want": 2},
        {"name": "killed-newer-save", "ops": [["copy_cut", B4, "ep0-ba6-rank0.pt"]], "names": "ep0-ba6-rank0.pt",
         "want": 4},
        # the run copied with links followed (cp -L, rsync -L, an object store): the copy is what loads
        {"name": "copied-link-killed-newer-save", "ops": [["deref", LINK], ["copy_cut", B4, "ep0-ba6-rank0.pt"]],
         "names": "ep0-ba6-rank0.pt", "want": 4},
        {"name": "copied-link-at-older", "ops": [["link", LINK, B2], ["deref", LINK]], "names": B4, "want": 2},
        {"name": "copied-link-target-deleted", "ops": [["deref", LINK], ["delete", B4]], "names": None, "want": 4},
    ]


def _trainer(root: str, max_duration: str, **kw):
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from composer import Trainer
    from composer.models import ComposerClassifier
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8, 4))
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 4, (64,), generator=g))
    return Trainer(model=ComposerClassifier(net, num_classes=4), train_dataloader=DataLoader(data, batch_size=4),
                   max_duration=max_duration, save_folder=root, save_interval="2ba", run_name="ckd",
                   autoresume=True, device="cpu", optimizers=torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                   progress_bar=False, log_to_console=False, **kw)


def worker(mode: str, root: str, result: str, load: dict) -> None:
    from composer import Callback
    seen: dict = {}

    class Look(Callback):
        def fit_start(self, state, logger):
            seen["start_batch"] = int(state.timestamp.batch)

    try:
        if mode == "save":
            _trainer(root, "4ba").fit()
        else:
            _trainer(root, "6ba", callbacks=[Look()], **load).fit()
        seen["finished"] = True
    except BaseException as exc:  # noqa: BLE001 - what the real resume raised is the label
        seen["raised"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    with open(result, "w") as fh:
        json.dump(seen, fh)


def run(mode: str, root: str, load: dict | None = None) -> dict:
    env = {"CUDA_VISIBLE_DEVICES": "", "CKD_COMPOSER_LOAD": json.dumps(load or {})}
    return damage.run_worker(__file__, mode, root, env)


def label(seen: dict, want: int) -> tuple[str, list]:
    if "raised" in seen:
        return "raises", [seen["raised"]] + ([f"after resuming at batch {seen['start_batch']}"]
                                             if "start_batch" in seen else [])
    if seen.get("start_batch") == 0:
        return "fresh-start", ["training began at batch 0: the saved progress was not loaded"]
    if seen.get("start_batch") != want:
        return "loads-other", [f"resumed at batch {seen.get('start_batch')}, not {want}"]
    return "loads", []


def main() -> None:
    args = damage.generator_args(__doc__, "composer")
    if args.worker:
        return worker(args.worker, args.root, args.result, json.loads(os.environ.get("CKD_COMPOSER_LOAD", "{}")))
    import composer
    import torch
    healthy = os.path.join(args.out, "run")
    shutil.rmtree(healthy, ignore_errors=True)
    assert run("save", healthy).get("finished"), "the healthy save failed"
    doc = {"library": "mosaicml", "version": composer.__version__, "torch": torch.__version__.split("+")[0],
           "generator": "tests/conformance/gen_composer.py", "world_size": 1,
           "stages": {"composer": {"root": "run", "cases": {}}}}
    damage.run_cases(doc, "composer", healthy, cases(),
                     lambda root, case: label(run("load", root, case.get("load")), case["want"]))
    damage.write_outcomes(args.out, doc)

if __name__ == "__main__":
    main()
