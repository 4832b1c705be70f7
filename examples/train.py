"""A small PyTorch training job for gpu-train: synthetic data, CPU or GPU, one node or many.

- Checkpoints every --checkpoint-every steps into JOB_DIR/checkpoints/, atomically (a temporary
  file renamed into place), keeping the newest --keep.
- Resumes from the newest checkpoint that loads, so a relaunch after preemption carries on.
- On SIGTERM or SIGINT it saves a last checkpoint and exits (143 / 130).
- On gpu-train's early warning (the file named by $GPU_TRAIN_NOTICE appears: a host maintenance
  or a preemption is coming) it saves a checkpoint at once and trains on until the SIGTERM.
- Under torchrun (WORLD_SIZE > 1) it trains with DistributedDataParallel: gloo on CPU, NCCL on
  GPU; rank 0 writes the checkpoints; the logged loss is all-reduced, so every rank logs the same.

    python train.py --job-dir /tmp/job --steps 300     (under gpu-train: --job-dir defaults to $JOB_DIR)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

stop_signal: int | None = None


def on_signal(signum, _frame) -> None:
    global stop_signal
    stop_signal = signum


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--job-dir", default=os.environ.get("JOB_DIR", "job"))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--keep", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-time", type=float, default=0.0, help="sleep per step, to stand in for a bigger model")
    return p.parse_args()


def batch(step: int, rank: int, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic per (step, rank): a resumed run sees exactly the data it would have seen."""
    g = torch.Generator().manual_seed(10_000 * step + rank)
    x = torch.randn(size, 32, generator=g)
    w = torch.linspace(-1, 1, 32)
    y = (x @ w).unsqueeze(1) + 0.1 * torch.randn(size, 1, generator=g)
    return x.to(device), y.to(device)


def checkpoints(job_dir: Path) -> list[Path]:
    return sorted((job_dir / "checkpoints").glob("ckpt_*.pt"))


def save(job_dir: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer, loss: float, keep: int) -> Path:
    folder = job_dir / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ckpt_{step:08d}.pt"
    tmp = folder / f".{path.name}.tmp"
    torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(), "loss": loss}, tmp)
    os.replace(tmp, path)
    for old in checkpoints(job_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load_newest(job_dir: Path, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """The step to start from: after the newest checkpoint that loads, else 0."""
    for path in reversed(checkpoints(job_dir)):
        try:
            state = torch.load(path, map_location="cpu")
        except Exception as e:  # a damaged file: fall back to the one before
            print(f"skipping unreadable checkpoint {path.name}: {e}", flush=True)
            continue
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        print(f"resumed from {path.name} (step {state['step']})", flush=True)
        return int(state["step"])
    return 0


def notice() -> str | None:
    """gpu-train's early warning: $GPU_TRAIN_NOTICE names a file that exists while a host maintenance
    or a preemption is announced (its text says which). A stat per step is cheap."""
    path = os.environ.get("GPU_TRAIN_NOTICE")
    if not path or not os.path.exists(path):
        return None
    try:
        return json.loads(Path(path).read_text()).get("event", "notice")
    except (OSError, ValueError):
        return "notice"


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if world > 1:
        dist.init_process_group(backend="nccl" if cuda else "gloo")
        if cuda:
            torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    job_dir = Path(args.job_dir)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    start = load_newest(job_dir, model, opt)  # before DDP wraps it: every rank loads the same state
    ddp = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    print(f"rank {rank}/{world} on {device}, steps {start}..{args.steps}", flush=True)

    loss_value = float("nan")
    step = start
    warned = False
    while step < args.steps:
        step += 1
        x, y = batch(step, rank, args.batch_size, device)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        reported = loss.detach()
        if world > 1:
            dist.all_reduce(reported)
            reported /= world
        loss_value = float(reported)
        if step % 10 == 0 or step == args.steps:
            print(f"step {step} loss {loss_value:.6f}", flush=True)
        if rank == 0 and (step % args.checkpoint_every == 0 or step == args.steps):
            save(job_dir, step, model, opt, loss_value, args.keep)
        if rank == 0 and not warned and (event := notice()):
            warned = True
            path = save(job_dir, step, model, opt, loss_value, args.keep)
            print(f"early warning ({event}): saved {path.name}, training on", flush=True)
        if args.step_time:
            time.sleep(args.step_time)
        if stop_signal is not None:
            if rank == 0:
                path = save(job_dir, step, model, opt, loss_value, args.keep)
                print(f"signal {stop_signal}: saved {path.name}, exiting", flush=True)
            return 128 + stop_signal
    if rank == 0:
        (job_dir / "metrics.json").write_text(json.dumps({"step": step, "loss": loss_value}))
    print(f"done: step {step} loss {loss_value:.6f}", flush=True)
    if world > 1:
        # Every rank reaches here before any tears down: a rank that destroys its group while a peer
        # is still busy (rank 0 saving the last checkpoint) can abort in gloo's teardown, and torchrun
        # on the other node then waits out its 300 s exit barrier.
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
