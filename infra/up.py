"""``scripts/up``: `pulumi up`, moving to another zone (or shape) when Compute Engine is out of GPUs.

On a stockout (ZONE_RESOURCE_POOL_EXHAUSTED, its _WITH_DETAILS form, 503 insufficientCapacity) the
stack moves to the next zone: those GCP named in zonesAvailable first, then the region's other
zones with the GPU, then the nearest regions. A regional quota error skips the region; a global
quota error or a configuration error stops at once. Each failed attempt's leftovers are destroyed;
the zone that worked is written back to the stack config (`pulumi config set`).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_train import capacity, config, validate
from gpu_train.catalog import load_catalog
from gpu_train.errors import ExitStatus, outcome

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Shape:
    machine_type: str
    gpu_type: str | None
    gpu_count: int | None
    spot: bool

    def settings(self) -> dict[str, str]:
        out = {"machineType": self.machine_type, "spot": str(self.spot).lower()}
        if self.gpu_type:
            out |= {"gpuType": self.gpu_type, "gpuCount": str(self.gpu_count)}
        return out

    def __str__(self) -> str:
        gpus = f" + {self.gpu_count} x {self.gpu_type}" if self.gpu_type else ""
        return f"{self.machine_type}{gpus}{' (spot)' if self.spot else ''}"


def shapes_to_try(cfg: config.StackConfig) -> list[Shape]:
    """The stack's shape, then its fallbackShapes, then (spotFallback) all of them on demand."""
    shapes = [Shape(cfg.machine_type, cfg.gpu_type, cfg.gpu_count, cfg.spot)]
    shapes += [Shape(*config.parse_shape(text), cfg.spot) for text in cfg.fallback_shapes]
    if cfg.spot and cfg.spot_fallback:
        shapes += [Shape(s.machine_type, s.gpu_type, s.gpu_count, False) for s in shapes]
    return shapes


def run_pulumi(args: list[str], echo: bool = True) -> tuple[int, str]:
    """Run the Pulumi CLI in the project, showing its output as it comes; (exit code, output)."""
    proc = subprocess.Popen(["pulumi", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    assert proc.stdout is not None  # stdout=PIPE
    for line in proc.stdout:
        lines.append(line)
        if echo:
            sys.stdout.write(line)
    return proc.wait(), "".join(lines)


def up(stack: str, zones: list[str] | None, retry_until_up: bool, max_attempts: int, say: Callable[[str], None],
       pulumi: Callable[[list[str]], tuple[int, str]] = run_pulumi, sleep: Callable[[float], None] = time.sleep) -> int:
    catalog = load_catalog()
    raw = config.read_stack_file(config.stack_file(stack))
    cfg, _ = validate.check(raw, stack, catalog)
    attempt = 0
    delay = 30.0
    while True:
        for shape in shapes_to_try(cfg):
            candidate = validate.check({**raw, **{f"gpu-train:{k}": v for k, v in shape.settings().items()}},
                                       stack, catalog)[0]
            gpu = validate.shape_of(candidate, catalog)
            machine = catalog.parse_machine_type(shape.machine_type)
            plan = zones or capacity.zone_plan(cfg.zone, gpu.gpu_type, catalog, catalog.zones_for(gpu.gpu_type, machine))
            tried: set[str] = set()
            skipped: set[str] = set()
            todo = list(plan)
            while todo:
                zone = todo.pop(0)
                attempt += 1
                if attempt > max_attempts:
                    say(f"stopping after {max_attempts} attempts (--max-attempts)")
                    return ExitStatus.FAILED
                tried.add(zone)
                say(f"attempt {attempt}: {shape} in {zone}")
                for key, value in {**shape.settings(), "zone": zone}.items():
                    code, out = pulumi(["config", "set", f"gpu-train:{key}", value, "--stack", stack])
                    if code:
                        say(f"pulumi config set failed: {out.strip()}")
                        return ExitStatus.FAILED
                code, out = pulumi(["up", "--yes", "--skip-preview", "--stack", stack])
                if code == 0:
                    say(f"up: {shape} in {zone} (attempt {attempt}); the stack's zone is now {zone}")
                    return ExitStatus.OK
                failure = capacity.classify(out)
                say(f"attempt {attempt} failed: {failure.kind}: {failure.reason}")
                pulumi(["destroy", "--yes", "--skip-preview", "--stack", stack])  # this attempt's leftovers
                if not failure.moves_zone:
                    say("not a capacity problem: no other zone will help" if failure.kind != capacity.GLOBAL_QUOTA else
                        f"the global GPU quota ({failure.metric}) is exhausted: request more (quotaRequest, or the "
                        "console's Quotas page); no zone helps")
                    return ExitStatus.FAILED
                if failure.kind == capacity.REGIONAL_QUOTA:
                    skipped.add(zone.rsplit("-", 1)[0])
                    say(f"skipping region {zone.rsplit('-', 1)[0]} (quota)")
                todo = capacity.next_zones(plan, tried, failure, skipped)
            say(f"no zone had capacity for {shape}")
        if not retry_until_up:
            return ExitStatus.FAILED
        say(f"every zone and shape tried; trying again in {delay:.0f} s (--retry-until-up)")
        sleep(delay)
        delay = min(delay * 2, 600)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/up", description=__doc__.split("\n\n")[0])
    p.add_argument("--stack", required=True)
    p.add_argument("--zones", default="auto", help="auto, or a comma-separated list to try in order")
    p.add_argument("--retry-until-up", action="store_true", help="start over (with backoff) when every zone failed")
    p.add_argument("--max-attempts", type=int, default=20)
    p.add_argument("--skip-preflight", action="store_true", help="do not check quotas first")
    args = p.parse_args(argv)
    if not shutil.which("pulumi"):
        print("scripts/up needs the Pulumi CLI (https://www.pulumi.com/docs/install/)", file=sys.stderr)
        return ExitStatus.USAGE
    if not args.skip_preflight:
        from infra import preflight

        code = preflight.main(["--stack", args.stack])
        if code == ExitStatus.FAILED:
            return ExitStatus.FAILED
    zones = None if args.zones == "auto" else [z.strip() for z in args.zones.split(",") if z.strip()]
    try:
        return up(args.stack, zones, args.retry_until_up, args.max_attempts, lambda s: print(f"[up] {s}", flush=True))
    except config.ConfigError as e:
        status, message = outcome(e)
        print(message, file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
