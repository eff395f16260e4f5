"""One rank of a forensics scenario (run by torchrun or directly; see gen_forensics.py).

    forensics_worker.py MODE CKPT

It behaves as a trainer does: a log line before each load or save naming the path (trainers log
"loading checkpoint from ..."), then the real library call; what it raises is left uncaught, so the log
holds exactly what torch, torchrun and Python print for it.  Modes:

  dcp-save      save a small sharded state dict with dcp.save (every rank)
  dcp-load      load it back with dcp.load (every rank)
  dcp-save-big  dcp.save of 4 MiB per rank (into a 1 MiB tmpfs: ENOSPC)
  dcp-load-killed  rank 1 is SIGKILLed before the load (as the OOM killer does); the others load
  torch-load    torch.load of CKPT (one process)
  torch-load-as-limit  torch.load under an address-space limit below what the file needs
  dcp-save-digests  dcp.save, then ckptdoctor.resume.record of what each rank saved
  dcp-resume-forgot  dcp.load of the model only: the trainer bug of a step counter never restored,
                caught by ckptdoctor.resume.check (derived state: every file is complete)
  mc-load       Megatron-Core dist_checkpointing.load of the iteration the tracker names in run root CKPT
                (gen_megatron.py's sharded state dict, 2 ranks)
  ds-load       DeepSpeed ZeRO-2 engine.load_checkpoint(CKPT) (2 ranks; gen_deepspeed.py's engine)
  trainer-resume  Trainer.train(resume_from_checkpoint=True) in output_dir CKPT (gen_trainer.py's trainer)
"""
from __future__ import annotations

import datetime
import os
import signal
import sys
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

mode, ckpt = sys.argv[1], sys.argv[2]
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("FORENSICS_TIMEOUT", "15")))


def state(rank: int, world: int, big: bool = False) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    mesh = init_device_mesh("cpu", (world,))
    rows = 1024 if big else 4
    local = torch.full((rows, 1024 if big else 8), float(rank))
    return {"model.weight": DTensor.from_local(local, mesh, [Shard(0)]), "model.bias": torch.ones(8),
            "step": 100}


def log(msg: str) -> None:
    rank = int(os.environ.get("RANK", "0"))
    print(f"{datetime.datetime.now().isoformat(sep=' ', timespec='milliseconds')} rank{rank} INFO {msg}",
          flush=True)


def main() -> None:
    import torch.distributed.checkpoint as dcp
    if mode.startswith("torch-load"):
        if mode == "torch-load-as-limit":  # what is mapped now, plus less than the file needs
            import resource
            with open("/proc/self/status") as fh:
                vm = next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("VmSize:"))
            limit = vm + os.path.getsize(ckpt) // 2
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        log(f"loading checkpoint from {ckpt}")
        sd = torch.load(ckpt, weights_only=True)
        log(f"loaded {len(sd)} keys")
        return
    if mode == "ds-load":
        import deepspeed
        from gen_deepspeed import _engine
        deepspeed.init_distributed(dist_backend="gloo", timeout=TIMEOUT)
        engine = _engine(2)
        log(f"loading checkpoint from {ckpt}")
        path, _ = engine.load_checkpoint(ckpt)
        log(f"resumed from {path}")
        x = torch.ones(4, 8)             # the first training step: its collectives wait for every rank
        engine.backward(engine(x).pow(2).sum())
        engine.step()
        log("step done")
        return
    if mode == "trainer-resume":
        from gen_trainer import _trainer
        log(f"resuming from the newest checkpoint in {ckpt}")
        _trainer(ckpt, 6).train(resume_from_checkpoint=True)
        return
    dist.init_process_group("gloo", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    if mode == "mc-load":
        from gen_megatron import TRACKER, _state
        from megatron.core import dist_checkpointing
        it = int(open(os.path.join(ckpt, TRACKER)).read().strip())
        d = os.path.join(ckpt, f"iter_{it:07d}")
        log(f"loading checkpoint from {d}")
        dist_checkpointing.load(_state(rank, it, empty=True), d)
        log(f"resumed from iteration {it}")
        dist.barrier()
        dist.destroy_process_group()
        return
    if mode in ("dcp-save-digests", "dcp-resume-forgot"):
        from ckptdoctor import resume
        sd = state(rank, world)
        sd["progress"] = {"step": torch.tensor(100)}
        if mode == "dcp-save-digests":
            log(f"saving checkpoint to {ckpt}")
            dcp.save(sd, checkpoint_id=ckpt)
            resume.record(sd, ckpt, rng=False)
        else:
            sd["progress"]["step"] = torch.tensor(0)
            log(f"loading checkpoint from {ckpt}")
            dcp.load({"model.weight": sd["model.weight"], "model.bias": sd["model.bias"]}, checkpoint_id=ckpt)
            resume.check(sd, ckpt, rng=False)
            log("resume proven")
        dist.barrier()
        dist.destroy_process_group()
        return
    if mode in ("dcp-save", "dcp-save-big"):
        log(f"saving checkpoint to {ckpt}")
        dcp.save(state(rank, world, big=mode == "dcp-save-big"), checkpoint_id=ckpt)
        log(f"saved checkpoint to {ckpt}")
    else:
        sd = state(rank, world)
        if mode == "dcp-load-killed" and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        log(f"loading checkpoint from {ckpt}")
        dcp.load(sd, checkpoint_id=ckpt)
        log(f"resumed from step {sd['step']}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
