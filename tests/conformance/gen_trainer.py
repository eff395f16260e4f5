"""Generator: Hugging Face Trainer checkpoints written by the Trainer, damaged, labelled by its own resume.

    python tests/conformance/gen_trainer.py [--out tests/fixtures/real/transformers]

Needs the `conformance` extra (transformers, torch).  It trains a tiny GPT-2 (built from a config, no
hub) for 4 steps on the CPU, saving every 2 (`checkpoint-2`, `checkpoint-4`), then for every damage
case copies the output_dir, damages it and runs `trainer.train(resume_from_checkpoint=True)` to step 6
in a fresh process.  A callback looks at what the resume restored when training begins:

  loads               global_step, optimizer moments, LR schedule and RNG state all restored
  loses-exactness     everything but the RNG state (transformers logs it at INFO and goes on)
  drops-state         it resumed the step but restarted the optimizer or the LR schedule, silently
  raises              the resume raised (type and text recorded)
"""
from __future__ import annotations

import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import damage  # noqa: E402


def cases() -> list[dict]:
    c4 = "checkpoint-4"
    return [
        {"name": "healthy", "ops": [], "names": None},
        {"name": "optimizer-missing", "ops": [["delete", f"{c4}/optimizer.pt"]], "names": f"{c4}/optimizer.pt"},
        {"name": "scheduler-missing", "ops": [["delete", f"{c4}/scheduler.pt"]], "names": f"{c4}/scheduler.pt"},
        {"name": "rng-missing", "ops": [["delete", f"{c4}/rng_state.pth"]], "names": f"{c4}/rng_state.pth"},
        {"name": "weights-truncated", "ops": [["truncate", f"{c4}/model.safetensors"]],
         "names": f"{c4}/model.safetensors"},
        {"name": "optimizer-truncated", "ops": [["truncate", f"{c4}/optimizer.pt"]], "names": f"{c4}/optimizer.pt"},
        {"name": "trainer-state-missing", "ops": [["delete", f"{c4}/trainer_state.json"]],
         "names": f"{c4}/trainer_state.json"},
        {"name": "killed-newer-save", "ops": [["copy_partial", c4, "checkpoint-6", "model.safetensors"]],
         "names": "checkpoint-6"},
        # a file this user may not read (another user's umask, a copy that kept modes): what the resume opens
        *({"name": f"{f.split('.')[0].replace('_', '-')}-unreadable", "ops": [["unreadable", f"{c4}/{f}"]],
           "names": f"{c4}/{f}"} for f in ("trainer_state.json", "config.json", "rng_state.pth", "optimizer.pt",
                                           "training_args.bin", "generation_config.json")),
    ]


def _trainer(out: str, max_steps: int):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16))
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": (ids := torch.randint(0, 64, (8,), generator=g)), "labels": ids} for _ in range(64)]
    args = TrainingArguments(output_dir=out, max_steps=max_steps, save_steps=2, per_device_train_batch_size=2,
                             learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=2, report_to=[],
                             use_cpu=True, seed=0, logging_strategy="no", save_strategy="steps",
                             dataloader_num_workers=0)
    return Trainer(model=model, args=args, train_dataset=data)


def worker(mode: str, root: str, result: str) -> None:
    import logging
    from transformers import TrainerCallback
    seen: dict = {}
    if mode == "save":
        _trainer(root, 4).train()
        seen["ok"] = True
    else:
        msgs: list[str] = []

        class Grab(logging.Handler):
            def emit(self, rec):
                msgs.append(rec.getMessage())
        logging.getLogger("transformers").addHandler(Grab())
        logging.getLogger("transformers").setLevel(logging.INFO)

        class Look(TrainerCallback):
            def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kw):
                seen["global_step"] = state.global_step
                seen["optimizer_state"] = bool(optimizer is not None and len(optimizer.state))
                seen["scheduler_step"] = getattr(lr_scheduler, "last_epoch", None)

        tr = _trainer(root, 6)
        tr.add_callback(Look())
        try:
            tr.train(resume_from_checkpoint=True)
        except BaseException as exc:  # noqa: BLE001 - what the real resume raised is the label
            seen["raised"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        seen["rng_restored"] = not any("RNG" in m and ("Didn't find" in m or "not" in m.lower()) for m in msgs)
        seen["log"] = [m[:200] for m in msgs if "RNG" in m or "checkpoint" in m.lower()][:10]
    with open(result, "w") as fh:
        json.dump(seen, fh)


def run(mode: str, root: str, ops: list = ()) -> dict:
    return damage.run_worker(__file__, mode, root, {"CUDA_VISIBLE_DEVICES": "", "TRANSFORMERS_VERBOSITY": "info"},
                             prefix=damage.unprivileged(list(ops)))


def label(seen: dict, want_step: int) -> tuple[str, list]:
    if "raised" in seen:
        return "raises", [seen["raised"]]
    if seen.get("global_step") != want_step:
        return "drops-state", [f"resumed at step {seen.get('global_step')}, not {want_step}"]
    if not seen["optimizer_state"] or seen["scheduler_step"] != want_step:
        return "drops-state", [f"optimizer state restored: {seen['optimizer_state']}, "
                               f"scheduler at step {seen['scheduler_step']}"]
    if not seen["rng_restored"]:
        return "loses-exactness", seen["log"]
    return "loads", []


def main() -> None:
    args = damage.generator_args(__doc__, "transformers")
    if args.worker:
        return worker(args.worker, args.root, args.result)
    import torch
    import transformers
    healthy = os.path.join(args.out, "trainer")
    judge = lambda root, case: label(run("load", root, case["ops"]), 4)  # noqa: E731
    if args.cases:
        return damage.relabel(args.out, transformers.__version__, "trainer", healthy, cases(), args.cases, judge)
    shutil.rmtree(healthy, ignore_errors=True)
    assert run("save", healthy).get("ok"), "the healthy save failed"
    doc = {"library": "transformers", "version": transformers.__version__, "torch": torch.__version__.split("+")[0],
           "generator": "tests/conformance/gen_trainer.py", "world_size": 1,
           "stages": {"trainer": {"root": "trainer", "cases": {}}}}
    damage.run_cases(doc, "trainer", healthy, cases(), judge)
    damage.write_outcomes(args.out, doc)

if __name__ == "__main__":
    main()
