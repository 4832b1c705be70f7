"""``scripts/up``: `pulumi up` that shows what it will change, and only ever cleans up what it made.

- It reads what the stack holds first (`pulumi stack export`) and never destroys any of it.
- A stack with a VM: the changes to it are listed (in place / restarts the VM / replaces the VM,
  data disk kept) and anything that replaces is asked about first (`--yes` to skip; without a
  terminal it refuses). A VM that cannot start for lack of capacity is reported with the choices
  (`--retry-until-up` waits in its zone; `--move` replaces it elsewhere): never moved silently.
- A new stack (or `--move`): zones (and fallbackShapes, provisioningFallback's ways such as spot then
  Flex-start, spotFallback) are tried in turn, each shape and way zone by zone. Each attempt
  runs on a copy of the stack file (`--config-file`), so the stack file changes only when an attempt
  succeeded. After a failed attempt only the instances, data disks and placement policy that attempt
  created are removed (`pulumi destroy --target`); the service account, firewall rules and quota
  preferences stay. After a stockout the Compute API says which zones offer the machine and GPU.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_train.catalog.loader import load_catalog
from gpu_train.catalog.model import FLEX_START, ON_DEMAND, SPOT, Catalog
from gpu_train.environment import Environment, SettingError
from gpu_train.errors import ExitStatus, outcome
from gpu_train.gcp import capacity, changes, provisioning, validate
from gpu_train.retry import Backoff
from gpu_train.stack import config, stackfile
from gpu_train.stack.bucket import AREA_KEY, new_area
from gpu_train.stack.problems import ConfigError
from gpu_train.stack.settings import StackConfig
from infra.ops import pulumi_cli

# What an attempt may leave behind that the next zone would have to replace: removed between attempts.
ZONAL_TYPES = ("gcp:compute/instance:Instance", "gcp:compute/disk:Disk", "gcp:compute/resourcePolicy:ResourcePolicy")
NEXT_STEP = {
    capacity.STOCKOUT: "Compute Engine has no capacity for this shape there now",
    capacity.REGIONAL_QUOTA: "the region's quota is used up: another region may have some",
    capacity.NOT_OFFERED: "the zone does not offer this machine or GPU type",
    capacity.TRANSIENT: "a passing error: another zone, or later",
    capacity.GLOBAL_QUOTA: "the project's global GPU quota is exhausted: no zone helps; request more "
    "(gpu-train:quotaRequest, or the console's Quotas page)",
    capacity.CONFIG: "the shape itself is invalid: no zone helps; fix the stack (scripts/plan --stack NAME)",
    capacity.PREFERENCE_EXISTS: "this project already asked Cloud Quotas for that quota, and the up could not look "
    "it up first to adopt it (the warning above says why: credentials, or permission to "
    "list quota preferences): fix that and run again, or remove gpu-train:quotaRequest",
    capacity.UNKNOWN: "not a capacity problem: no other zone will help; the error above says what to fix",
}


@dataclass(frozen=True)
class Shape:
    """One thing to try: a machine shape, had one way (on-demand, spot, flex-start, reservation)."""

    machine_type: str
    gpu_type: str | None
    gpu_count: int | None
    way: str = ON_DEMAND
    set_flex: bool = False  # the stack says flexStart: the setting must be written either way

    @property
    def spot(self) -> bool:
        return self.way == SPOT

    def settings(self) -> dict[str, str]:
        out = {"machineType": self.machine_type, "spot": str(self.spot).lower()}
        if self.way == FLEX_START or self.set_flex:
            out["flexStart"] = str(self.way == FLEX_START).lower()
        if self.gpu_type:
            out |= {"gpuType": self.gpu_type, "gpuCount": str(self.gpu_count)}
        return out

    def __str__(self) -> str:
        gpus = f" + {self.gpu_count} x {self.gpu_type}" if self.gpu_type else ""
        return f"{self.machine_type}{gpus}{'' if self.way == ON_DEMAND else f' ({self.way})'}"


def shapes_to_try(cfg: StackConfig, catalog: Catalog | None = None) -> list[Shape]:
    """The stack's shape, then its fallbackShapes; each the stack's way, then the ways provisioningFallback
    names (where the shape can be had so), in its order; then (spotFallback) every spot one on demand.
    Each is tried zone by zone before the next."""
    own = provisioning.way(cfg)
    ways = list(dict.fromkeys([own, *cfg.provisioning_fallback]))
    machines = [(cfg.machine_type, cfg.gpu_type, cfg.gpu_count)] + [config.parse_shape(t) for t in cfg.fallback_shapes]
    shapes = [
        Shape(m, g, c, w, cfg.flex_start) for m, g, c in machines for w in ways if catalog is None or w == own or w in catalog.ways(m)
    ]
    if cfg.spot and cfg.spot_fallback:
        shapes += [Shape(s.machine_type, s.gpu_type, s.gpu_count, ON_DEMAND, cfg.flex_start) for s in shapes if s.way == SPOT]
    return list(dict.fromkeys(shapes))


def ask(env: Environment, question: str, yes: bool, say: Callable[[str], None]) -> bool:
    """--yes, or a "yes" typed at a terminal; with no terminal to ask, refuse."""
    if yes:
        return True
    if not env.stdin_isatty:
        say(f"refusing: {question} needs a yes, and there is no terminal to ask (pass --yes to go ahead)")
        return False
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def offering_zones(env: Environment, cfg: StackConfig, gpu_type: str, say: Callable[[str], None]) -> list[str] | None:
    """Zones that offer the machine type and the GPU, from the Compute API; None if it cannot be asked."""
    from infra.ops import preflight

    try:
        return preflight.offering_zones(env, cfg.project or "", cfg.machine_type, gpu_type)
    except Exception as e:  # credentials, network: the catalog's snapshot will do
        say(
            f"(cannot ask the Compute API which zones offer {cfg.machine_type} + {gpu_type}: {type(e).__name__}; using the catalog's zones)"
        )
        return None


class Up:
    """One `scripts/up` run on one stack."""

    def __init__(
        self,
        env: Environment,
        stack: str,
        yes: bool,
        say: Callable[[str], None],
        retry_delay: float = 30.0,
        pulumi: pulumi_cli.Runner = pulumi_cli.run,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.env, self.stack, self.yes, self.say, self.pulumi, self.sleep = env, stack, yes, say, pulumi, sleep
        self.retry_delay = retry_delay
        self.catalog = load_catalog()
        self.path = env.stack_file(stack)
        self.raw = stackfile.read_stack_file(self.path)
        self.cfg, _ = validate.check(self.raw, stack, self.catalog)
        # A stack with a bucket and no area of its own gets one with this up (written back only when it succeeds,
        # with the settings that worked), so that its VM's grant is on its own folder of the bucket: another stack
        # of its name there has another (gpu_train.stack.bucket.area_of).
        self.new_area = {AREA_KEY: new_area(stack)} if self.cfg.bucket and not self.cfg.bucket_area else {}

    # -- a stack with a VM ---------------------------------------------------------------------
    def existing(self, before: list[pulumi_cli.Resource], retry_until_up: bool, max_attempts: int) -> int:
        from infra.ops import plan  # the program under mocks: only needed to compare with a deployed VM

        found = plan.changes_against(plan.wanted(self.cfg, self.catalog), before)
        self.say(changes.render(found, self.stack, self.env.cli))
        if changes.replaces_anything(found) and not ask(self.env, "Apply these changes (they replace something)?", self.yes, self.say):
            return ExitStatus.FAILED
        backoff = Backoff(self.retry_delay, cap=600)
        for attempt in range(1, max_attempts + 1):
            if self.new_area:  # (on a copy of the stack file, as a new stack's attempts)
                code, out = self.attempt(self.new_area)
            else:
                code, out = self.pulumi(["up", "--yes", "--skip-preview", "--stack", self.stack])
            if code == 0:
                self.write_back(self.new_area)
                self.say(f"up: stack {self.stack} is up in {self.cfg.zone}")
                return ExitStatus.OK
            failure = capacity.classify(out)
            self.say(f"up failed: {failure.kind}: {failure.reason}")
            if failure.kind not in (capacity.STOCKOUT, capacity.TRANSIENT) or not retry_until_up:
                return self.report_existing(failure)
            if attempt < max_attempts:
                delay = backoff.next()
                self.say(f"still no capacity in {self.cfg.zone}; trying again in {delay:.0f} s (--retry-until-up)")
                self.sleep(delay)
        self.say(f"stopping after {max_attempts} attempts (--max-attempts); the stack is as it was")
        return ExitStatus.FAILED

    def report_existing(self, failure: capacity.Failure) -> int:
        self.say(
            f"Nothing was destroyed and nothing moved: the VM, its data disk and the stack file "
            f"({self.path.name}) are as they were. {NEXT_STEP.get(failure.kind, '')}."
        )
        if failure.kind in (capacity.STOCKOUT, capacity.TRANSIENT):
            gpu = validate.shape_of(self.cfg, self.catalog).gpu_type
            offered = offering_zones(self.env, self.cfg, gpu, self.say)
            where = f" (zones offering {self.cfg.machine_type} + {gpu}: {', '.join(offered)})" if offered else ""
            self.say(
                "What to do:\n"
                f"  scripts/up --stack {self.stack} --retry-until-up   keep trying in {self.cfg.zone} "
                "(the VM and its runs stay as they are)\n"
                f"  scripts/up --stack {self.stack} --move             replace the VM in another zone{where}: a "
                "disk cannot leave its zone, so the data disk is replaced too and only the runs you fetched home "
                f"({self.env.cli} fetch --all, which needs the VM running) survive"
            )
        return ExitStatus.FAILED

    def move(self, before: list[pulumi_cli.Resource], zones: list[str] | None, retry: bool, max_attempts: int) -> int:
        disks = pulumi_cli.of_type(before, "compute/disk:Disk")
        self.say(
            f"--move replaces the VM of stack {self.stack} in another zone. A disk cannot leave its zone: its "
            f"data disk{'s' if len(disks) > 1 else ''} ({', '.join(d.name for d in disks)}) will be deleted with "
            "every run on it; only what you fetched home (runs/) survives."
        )
        if not ask(self.env, "Replace the VM and its data disk elsewhere?", self.yes, self.say):
            return ExitStatus.FAILED
        for disk in disks:
            code, out = self.pulumi(["state", "unprotect", disk.urn, "--yes", "--stack", self.stack], echo=False)
            if code:
                self.say(f"cannot unprotect {disk.name}: {out.strip()}")
                return ExitStatus.FAILED
        return self.failover(before, zones, retry, max_attempts, skip_zone=self.cfg.zone)

    # -- a new stack: try zones and shapes ------------------------------------------------------
    def failover(
        self,
        before: list[pulumi_cli.Resource],
        zones: list[str] | None,
        retry_until_up: bool,
        max_attempts: int,
        skip_zone: str | None = None,
    ) -> int:
        attempt, backoff = 0, Backoff(self.retry_delay, cap=600)
        kept = {(r.urn, r.id) for r in before}
        offered: list[str] | None = None
        while True:
            for shape in shapes_to_try(self.cfg, self.catalog):
                candidate = validate.check(
                    {**self.raw, **{f"gpu-train:{k}": v for k, v in shape.settings().items()}}, self.stack, self.catalog
                )[0]
                gpu = validate.shape_of(candidate, self.catalog)
                machine = self.catalog.parse_machine_type(shape.machine_type)
                plan_zones = zones or capacity.zone_plan(
                    self.cfg.zone, gpu.gpu_type, self.catalog, self.catalog.zones_for(gpu.gpu_type, machine)
                )
                tried: set[str] = {skip_zone} if skip_zone else set()
                skipped: set[str] = set()
                todo = [z for z in plan_zones if z not in tried]
                while todo:
                    zone = todo.pop(0)
                    attempt += 1
                    if attempt > max_attempts:
                        self.say(f"stopping after {max_attempts} attempts (--max-attempts); the stack file is as it was")
                        return ExitStatus.FAILED
                    tried.add(zone)
                    self.say(f"attempt {attempt}: {shape} in {zone}")
                    settings = {**shape.settings(), "zone": zone, **self.new_area}
                    code, out = self.attempt(settings)
                    if code == 0:
                        self.write_back(settings)
                        self.say(f"up: {shape} in {zone} (attempt {attempt}); the stack's zone is now {zone}")
                        return ExitStatus.OK
                    failure = capacity.classify(out)
                    self.say(f"attempt {attempt} failed: {failure.kind}: {failure.reason}")
                    if not self.remove_leftovers(kept):
                        return ExitStatus.FAILED
                    if not failure.moves_zone:
                        self.say(f"{NEXT_STEP[failure.kind]}. The stack file is as it was.")
                        return ExitStatus.FAILED
                    if failure.kind == capacity.REGIONAL_QUOTA:
                        skipped.add(zone.rsplit("-", 1)[0])
                        self.say(f"skipping region {zone.rsplit('-', 1)[0]} (quota)")
                    if failure.kind == capacity.STOCKOUT and offered is None and not zones:
                        offered = offering_zones(self.env, candidate, gpu.gpu_type, self.say) or []
                    todo = capacity.next_zones(plan_zones, tried, failure, skipped)
                    if offered:
                        todo = [z for z in todo if z in offered]
                self.say(f"no zone had capacity for {shape}")
            if not retry_until_up:
                self.say("every zone and shape tried; the stack file is as it was")
                return ExitStatus.FAILED
            delay = backoff.next()
            self.say(f"every zone and shape tried; trying again in {delay:.0f} s (--retry-until-up)")
            self.sleep(delay)

    def attempt(self, settings: dict[str, str]) -> tuple[int, str]:
        """`pulumi up` with these settings on a copy of the stack file: the real one is not touched."""
        with tempfile.TemporaryDirectory(prefix="gpu-train-up-") as tmp:
            copy = Path(tmp) / self.path.name
            shutil.copyfile(self.path, copy)
            for key, value in settings.items():
                code, out = self.pulumi(
                    ["config", "set", f"gpu-train:{key}", value, "--stack", self.stack, "--config-file", str(copy)], echo=False
                )
                if code:
                    return code, out
            return self.pulumi(["up", "--yes", "--skip-preview", "--stack", self.stack, "--config-file", str(copy)])

    def remove_leftovers(self, kept: set[tuple[str, str]]) -> bool:
        """Remove what the failed attempt created in its zone (instances, data disks, placement policy)."""
        after = pulumi_cli.stack_resources(self.stack, self.pulumi) or []
        mine = [r for r in after if (r.urn, r.id) not in kept and r.typ in ZONAL_TYPES]
        if not mine:
            return True
        for r in mine:
            if r.protect:  # a data disk this attempt created: empty, and in the wrong zone for the next one
                self.pulumi(["state", "unprotect", r.urn, "--yes", "--stack", self.stack], echo=False)
        targets = [arg for r in mine for arg in ("--target", r.urn)]
        self.say(f"removing what this attempt created: {', '.join(r.name for r in mine)}")
        code, out = self.pulumi(["destroy", "--yes", "--skip-preview", "--stack", self.stack, *targets])
        if code:
            self.say(f"could not remove them ({out.strip()[-300:]}); stopping: `pulumi stack export` shows the stack")
        return code == 0

    def write_back(self, settings: dict[str, str]) -> None:
        """The settings that worked, into the stack file (only those that differ from it)."""
        for key, value in settings.items():
            current = self.raw.get(f"gpu-train:{key}")
            if current is not None and str(current).lower() == value.lower():
                continue
            self.pulumi(["config", "set", f"gpu-train:{key}", value, "--stack", self.stack], echo=False)
        if AREA_KEY in settings:
            self.say(
                f"this stack's runs now go to their own folder of its bucket, {settings[AREA_KEY]}: gpu-train:{AREA_KEY} "
                f"is in {self.path} (commit it); runs started before keep their old folder, which the VM's grant no "
                "longer covers (docs/bucket.md)"
            )


def main(argv: list[str] | None = None, env: Environment | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/up", description=__doc__.split("\n\n")[0])
    p.add_argument("--stack", required=True)
    p.add_argument("--zones", default="auto", help="new stacks, --move: auto, or a comma-separated list to try in order")
    p.add_argument("--retry-until-up", action="store_true", help="keep trying (with backoff) when there is no capacity")
    p.add_argument(
        "--retry-delay", type=float, default=30.0, metavar="SECONDS", help="--retry-until-up: the first wait (it doubles, up to 10 minutes)"
    )
    p.add_argument(
        "--move",
        action="store_true",
        help="a stack with a VM: replace it in another zone (its data disk too: only runs fetched home survive)",
    )
    p.add_argument("--yes", action="store_true", help="do not ask before replacing anything")
    p.add_argument("--max-attempts", type=int, default=20)
    p.add_argument("--skip-preflight", action="store_true", help="do not check quotas first")
    args = p.parse_args(argv)
    if not shutil.which("pulumi"):
        print("scripts/up needs the Pulumi CLI (https://www.pulumi.com/docs/install/)", file=sys.stderr)
        return ExitStatus.USAGE
    zones = None if args.zones == "auto" else [z.strip() for z in args.zones.split(",") if z.strip()]
    try:
        env = env or Environment.from_os()
        run = Up(env, args.stack, args.yes, lambda s: print(f"[up] {s}", flush=True), args.retry_delay)
    except (ConfigError, SettingError) as e:
        status, message = outcome(e)
        print(message, file=sys.stderr)
        return status
    from infra.ops import bucketaccess

    if (why := bucketaccess.bucket_problem(run.cfg)) is not None:  # not skipped: the grants need it
        print(why, file=sys.stderr)
        return ExitStatus.USAGE
    if not args.skip_preflight:
        from infra.ops import preflight

        if preflight.main(["--stack", args.stack], env) == ExitStatus.FAILED:
            return ExitStatus.FAILED
    before = pulumi_cli.stack_resources(args.stack) or []
    if pulumi_cli.has_vm(before):
        if args.move:
            return run.move(before, zones, args.retry_until_up, args.max_attempts)
        return run.existing(before, args.retry_until_up, args.max_attempts)
    return run.failover(before, zones, args.retry_until_up, args.max_attempts)


if __name__ == "__main__":
    sys.exit(main())
