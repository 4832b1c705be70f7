"""``scripts/plan``: what ``pulumi up`` would create for a stack, and what it costs, offline.

Validates the stack, then runs the real program under Pulumi's mock runtime (no credentials, no
Pulumi CLI) and prints each resource with its key properties. Exit 0 when the stack is valid;
2 with every problem on stderr when it is not.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

from gpu_train.catalog.loader import load_catalog
from gpu_train.catalog.model import FLEX_START, ON_DEMAND, RESERVATION, SPOT, Catalog, dated
from gpu_train.contract import RUN_LIMIT_NOTICE_S
from gpu_train.environment import CLI, Environment, SettingError
from gpu_train.errors import ExitStatus, outcome
from gpu_train.gcp import changes, images, provisioning, validate, vm
from gpu_train.gcp.pricing import Cost, hourly_cost
from gpu_train.stack import stackfile
from gpu_train.stack.problems import ConfigError, Problem
from gpu_train.stack.settings import StackConfig
from infra import program, recovery
from infra.ops import preview, pulumi_cli

NOTICE_MINUTES = RUN_LIMIT_NOTICE_S // 60


KEY_PLACEHOLDER = "ssh-ed25519 AAAA...(your key)"


def _money(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.2f}"


def describe_cost(cost: Cost, way: str, ways: tuple[str, ...], unknown_where: str) -> list[str]:
    """The price of each way the shape may be had (the catalog's ways), the stack's own marked."""
    lines = [
        f"Cost per VM ({cost.region} list prices{dated(cost.date)}; other regions differ, spot prices may change daily):",
        f"  {'':<24}{'per hour':>10}{'per day':>11}",
    ]
    prices = {ON_DEMAND: cost.on_demand, SPOT: cost.spot, FLEX_START: None, RESERVATION: cost.on_demand}
    labels = {ON_DEMAND: "on demand", SPOT: "spot", FLEX_START: "flex-start", RESERVATION: "reservation"}
    notes = {
        FLEX_START: "  (its own Dynamic Workload Scheduler rate: not in the catalog)",
        RESERVATION: "  (the on-demand rate, unless a commitment covers it)",
    }
    for w in dict.fromkeys([*ways, way]):
        value = prices[w]
        mark = "  <- this stack" if w == way else ""
        per_day = None if value is None else value * 24
        lines.append(f"  {labels[w]:<24}{_money(value):>10}{_money(per_day):>11}{mark}{notes.get(w, '')}")
    if prices[way] is None:
        lines.append(f"  The catalog has no trustworthy price for this: see {unknown_where}.")
    return lines


def describe_run_limit(cfg: StackConfig, catalog: Catalog) -> list[str]:
    """When Compute Engine will stop the VM (maxRunDuration counts from each start), and what goes with it."""
    if not cfg.max_run_hours:
        return []
    hours = cfg.max_run_hours
    lines = [
        f"Run-time cap: Compute Engine stops the VM {hours:g} h after each start (maxRunDuration "
        f"{provisioning.run_seconds(hours)} s, then STOP: the disks stay); `{CLI} status` shows the moment, and "
        f"the job's $GPU_TRAIN_NOTICE file appears {NOTICE_MINUTES} minutes before it"
    ]
    if vm.has_local_ssd(cfg, catalog):
        lines.append(
            "  The shape's bundled Local SSD is discarded at that stop (onInstanceStopAction.discardLocalSsd: "
            "Compute Engine refuses the VM otherwise); runs live on the data disk"
        )
    return lines


def describe_local_ssd(cfg: StackConfig, catalog: Catalog) -> list[str]:
    """Every stop of a shape with bundled Local SSD wipes it; and `pulumi up` cannot make that stop."""
    if not vm.has_local_ssd(cfg, catalog):
        return []
    return [
        "Local SSD: the shape's bundled Local SSD is wiped at every stop (vm-stop, idle auto-stop, preemption, "
        "maintenance, maxRunHours): keep nothing there that a run needs again; runs live on the data disk.",
        f"  `running: false` with a bare `pulumi up` cannot stop it (the provider's stop names no discardLocalSsd: "
        f"terraform-provider-google#26173); `{CLI} vm-stop` stops it through the Compute API (discardLocalSsd=true), "
        "then refreshes the stack",
    ]


def describe_data_disk(cfg: StackConfig, catalog: Catalog) -> list[str]:
    """The data disks bill per GB-month while they exist: also while the VM is stopped, and after a replacement."""
    kind = "/".join(dict.fromkeys(vm.data_disk_type(cfg, catalog, m) for m in vm.node_machine_types(cfg, catalog)))
    per_month = vm.data_disk_monthly_cost(cfg, catalog)
    count = f"{cfg.nodes} x " if cfg.nodes > 1 else ""
    price = "price unknown (check cloud.google.com/compute/disks-image-pricing)" if per_month is None else (f"{_money(per_month)} a month")
    return [
        f"Data disk{'s' if cfg.nodes > 1 else ''}: {count}{cfg.data_disk_size_gb} GB {kind}: {price}, "
        "billed while it exists, the VM running or not"
    ]


def describe_shape(shape: validate.GpuShape, cfg: StackConfig, catalog: Catalog) -> str:
    acc = catalog.accelerator(shape.gpu_type)
    assert acc is not None  # a validated shape's GPU is in the catalog
    how = "attached to" if shape.attached else "built into"
    model = {
        ON_DEMAND: "on demand",
        SPOT: "spot",
        FLEX_START: "Flex-start (Dynamic Workload Scheduler)",
        RESERVATION: f"in reservation {cfg.reservation}" + (" (RESERVATION_BOUND)" if cfg.reservation_bound else ""),
    }[provisioning.way(cfg)]
    return (
        f"GPU shape: {shape.gpu_count} x {acc.gpu} ({acc.memory_gb} GB, {shape.gpu_type}) {how} "
        f"{shape.machine_type} ({shape.vcpus} vCPUs, {shape.memory_gb:g} GB), {model}, in {cfg.zone}"
    )


def describe_fallback(cfg: StackConfig) -> list[str]:
    if not cfg.provisioning_fallback:
        return []
    order = " -> ".join(dict.fromkeys([provisioning.way(cfg), *cfg.provisioning_fallback]))
    return [f"scripts/up tries, zone by zone: {order} (provisioningFallback)"]


def _carries_gpus(machine_type: str, catalog: Catalog) -> bool:
    machine = catalog.parse_machine_type(machine_type)
    return machine is not None and machine.fixed is not None


def describe_pools(cfg: StackConfig, catalog: Catalog) -> list[str]:
    """One line per pool: its role, nodes, shape and what its nodes cost together; then the total."""
    lines = ["Pools (node 0 is the chief; TF_CONFIG roles follow the pools):"]
    shapes = validate.node_shapes(cfg, catalog)
    total: float | None = 0.0
    first = 0
    for pool in cfg.pools:
        shape = shapes[first]
        nodes = f"node {first}" if pool.count == 1 else f"nodes {first}-{first + pool.count - 1}"
        first += pool.count
        gpus = f"{shape.gpu_count} x {shape.gpu_type}" if shape.gpu_count else "no GPU"
        per_node = hourly_cost(shape, catalog).for_way(provisioning.way(cfg))
        cost = None if per_node is None else per_node * pool.count
        total = None if total is None or cost is None else total + cost
        lines.append(f"  {pool.role:<7}{nodes:<13}{pool.count} x {shape.machine_type} ({gpus}): {_money(cost)}/h")
    lines.append(
        f"  all {cfg.nodes} nodes: {_money(total)}/h, {_money(None if total is None else total * 24)}/day "
        f"({'spot' if cfg.spot else 'on demand'})"
    )
    return lines


def _props(r: preview.Declared, catalog: Catalog) -> list[str]:
    """The properties of each resource type that a reader checks before paying for it."""
    i = r.inputs
    if r.typ.endswith("Firewall"):
        verb, rules = ("allow", i.get("allows")) if i.get("allows") else ("deny", i.get("denies"))
        ports = ",".join(f"{x['protocol']}:{'/'.join(x.get('ports', []))}" for x in rules or [])
        sources = ", ".join(i.get("sourceRanges") or []) or "tag " + ", ".join(i.get("sourceTags") or [])
        return [
            f"name {i.get('name')}",
            f"{verb} {ports} from {sources}",
            f"to tag {', '.join(i.get('targetTags', []))}, priority {int(i.get('priority', 1000))}",
        ]
    if r.typ.endswith("Account"):
        return [f"account {i.get('accountId')}", i.get("description", "")]
    if r.typ.endswith("IAMMember"):
        return [f"{i.get('role')} for {i.get('member')}"]
    if r.typ.endswith("ResourcePolicy"):
        policy = sorted((i.get("groupPlacementPolicy") or {}).items())
        shown = ", ".join(f"{k}={int(v) if isinstance(v, float) else v}" for k, v in policy)
        return [f"name {i.get('name')}: compact placement ({shown})"]
    if r.typ == "pulumi:providers:gcp":
        return [f"for Cloud Quotas: userProjectOverride, billingProject {i.get('billingProject')} (user credentials need a quota project)"]
    if r.typ.endswith("projects/service:Service"):
        return [f"enable {i.get('service')} (left enabled on destroy)"]
    if r.typ.endswith("SQuotaPreference"):
        dims = ", ".join(f"{k}={v}" for k, v in sorted((i.get("dimensions") or {}).items())) or "project-wide"
        return [
            f"ask Cloud Quotas for {i.get('quotaId')} ({dims}) = {i['quotaConfig']['preferredValue']} (or the current limit, if higher)"
        ]
    if r.typ.endswith("compute/disk:Disk"):
        return [
            f"name {i.get('name')}: {int(i['size'])} GB {i.get('type')} in {i.get('zone')}, for REMOTE_ROOT/runs",
            f"kept when the VM is replaced; protected: `pulumi destroy` refuses it, `{CLI} down` fetches first"
            if r.protect
            else "NOT protected",
        ]
    if r.typ.endswith("Instance"):
        init = i["bootDisk"]["initializeParams"]
        gpus = i.get("guestAccelerators") or []
        sched = i.get("scheduling", {})
        meta = dict(i.get("metadata", {}))
        return [
            f"name {i.get('name')}, {i.get('machineType')} in {i.get('zone')}",
            "GPUs: "
            + (
                ", ".join(f"{int(g['count'])} x {g['type']} attached" for g in gpus)
                or ("built into the machine type" if _carries_gpus(i.get("machineType", ""), catalog) else "none (CPU only)")
            ),
            f"network: {i['networkInterfaces'][0].get('nicType') or 'default NIC'}"
            + (f", placement {i['resourcePolicies'].rsplit('/', 1)[-1]}" if i.get("resourcePolicies") else ""),
            f"boot disk: {int(init['size'])} GB {init['type']}, image {init['image'].rsplit('/', 1)[-1]} "
            "(newest of the family at `up`, then pinned)",
            "data disk: "
            + ", ".join(
                f"{d['source'].rsplit('/', 1)[-1]} as /dev/disk/by-id/google-{d['deviceName']}" for d in i.get("attachedDisks") or []
            ),
            "scheduling: " + ", ".join(f"{k}={v}" for k, v in sorted(sched.items())),
            *([f"reservationAffinity: {_affinity(i['reservationAffinity'])}"] if i.get("reservationAffinity") else []),
            f"desired status: {i.get('desiredStatus')}",
            "metadata: " + ", ".join(f"{k}={_meta(k, v)}" for k, v in sorted(meta.items())),
            f"service account: {i['serviceAccount']['email']} (scopes: "
            + ", ".join(s.rsplit("/", 1)[-1] for s in i["serviceAccount"].get("scopes") or [])
            + ")",
            f"network tag {', '.join(i.get('tags', []))}; labels " + ", ".join(f"{k}={v}" for k, v in sorted(i.get("labels", {}).items())),
        ]
    return []


def _affinity(affinity: dict[str, Any]) -> str:
    specific = affinity.get("specificReservation")
    if not specific:
        return str(affinity.get("type"))
    return f"{affinity.get('type')} ({specific.get('key')} = {', '.join(specific.get('values') or [])})"


def _meta(key: str, value: str) -> str:
    if key == "ssh-keys":
        return value.split(":")[0] + ":<key>"
    if key == "startup-script":
        return "<installs gpu-train-agent: resume on boot, checkpoint on shutdown, idle stop>"
    return value


def render(cfg: StackConfig, result: preview.Preview, warnings: list[Problem], catalog: Catalog) -> str:
    shape = validate.shape_of(cfg, catalog)
    lines = [f"Stack {cfg.stack}: project {cfg.project}, zone {cfg.zone} (region {cfg.region})", ""]
    lines += [
        describe_shape(shape, cfg, catalog),
        images.driver_note(cfg, catalog),
        f"Shutdown grace: {vm.grace_words(cfg)}",
        "",
    ]
    lines += [
        *describe_cost(hourly_cost(shape, catalog), provisioning.way(cfg), catalog.ways(shape.machine_type), catalog.prices_unknown_where),
        *describe_data_disk(cfg, catalog),
    ]
    lines += [*describe_run_limit(cfg, catalog), *describe_local_ssd(cfg, catalog), *describe_fallback(cfg), ""]
    if cfg.pools:
        lines += [*describe_pools(cfg, catalog), ""]
    if recovery.stops_for_good(cfg):
        lines += [recovery.describe(cfg), ""]
    lines.append(f"`pulumi up` would create {len(result.resources)} resources:")
    order = ["GpuVm", "Account", "IAMMember", "Firewall", "ResourcePolicy", "gcp", "Service", "SQuotaPreference", "Disk", "Instance"]

    def rank(kind: str) -> int:
        return order.index(kind) if kind in order else len(order)

    for r in sorted(result.resources, key=lambda r: (rank(r.typ.rsplit(":", 1)[-1]), r.name)):
        lines.append(f"  + {r.typ}  {r.name}")
        lines += [f"      {p}" for p in _props(r, catalog) if p]
    lines += ["", "Stack outputs (read by the tasks):"]
    lines += [f"  {k}: {_output(v)}" for k, v in result.outputs.items()]
    if warnings:
        lines += ["", "Warnings:"] + [f"  - {w}".replace("\n", "\n  ") for w in warnings]
    return "\n".join(lines)


def _output(value: Any) -> str:
    if value is None:
        return "null"
    if value in (preview.MOCK_EXTERNAL_IP, preview.MOCK_INTERNAL_IP):
        return f"(known after up, e.g. {value})"
    return str(value)


def wanted(cfg: StackConfig, catalog: Catalog) -> preview.Preview:
    """The resources the program declares for a valid GCP stack, under mocks (the real key when readable)."""
    public_key, _ = stackfile.read_public_key(cfg)
    return preview.run(lambda lookups: program.declare(cfg, public_key or KEY_PLACEHOLDER, catalog, lookups), stack=cfg.stack)


def changes_against(result: preview.Preview, deployed: list[pulumi_cli.Resource]) -> list[changes.Change]:
    """How the wanted resources differ from the deployed ones, each difference judged by the replace table."""
    want = {(r.typ, r.name): r.inputs for r in result.resources}
    have = {(r.typ, r.name): r.inputs for r in deployed if r.custom}
    return changes.compare(want, have, changes.load_rules(), {changes.INSTANCE: vm.INSTANCE_IGNORE_CHANGES})


def plan(raw: dict[str, Any], stack: str, deployed: list[pulumi_cli.Resource] | None = None) -> tuple[str, int]:
    """The plan's text and exit code (0 valid, 2 invalid), for a stack's raw settings; with what the
    stack holds (``deployed``), also what `pulumi up` would change on its VM."""
    catalog = load_catalog()
    try:
        cfg, warnings = validate.check(raw, stack, catalog)
    except ConfigError as e:
        status, message = outcome(e)
        return message, status
    if not cfg.is_gcp:
        hosts = ", ".join(map(str, cfg.hosts))
        return f"Stack {stack} targets SSH hosts ({hosts}): `pulumi up` creates nothing; use the tasks ({CLI} train, ...).", ExitStatus.OK
    _, problem = stackfile.read_public_key(cfg)
    if problem is not None:  # not needed to plan; `pulumi up` stops on it
        warnings = [
            *warnings,
            Problem(problem.key, problem.message + " (pulumi up will stop here)", problem.fix, problem.value, "warning"),
        ]
    result = wanted(cfg, catalog)
    if result.error is not None:
        return f"the program failed under the mock runtime: {result.error}", ExitStatus.USAGE
    text = render(cfg, result, warnings, catalog)
    if deployed is not None and pulumi_cli.has_vm(deployed):
        text += "\n\n" + changes.render(changes_against(result, deployed), stack, CLI)
    return text, ExitStatus.OK


def main(argv: list[str] | None = None, env: Environment | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/plan", description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--stack", help="a stack in stacks/ (stacks/Pulumi.NAME.yaml)")
    which.add_argument("--file", type=Path, help="a stack file anywhere")
    args = parser.parse_args(argv)
    try:
        env = env or Environment.from_os()
        path = args.file or env.stack_file(args.stack)  # (a missing stack is said, with its fix)
        stack = args.stack or stackfile.stack_name_from_path(path)
        raw = stackfile.read_stack_file(path)
    except (ConfigError, SettingError) as e:
        status, message = outcome(e)
        print(message, file=sys.stderr)
        return status
    deployed = None
    if args.stack and shutil.which("pulumi"):  # a deployed stack: also show what `up` would change on it
        deployed = pulumi_cli.stack_resources(stack)
    text, code = plan(raw, stack, deployed)
    print(text, file=sys.stderr if code else sys.stdout)
    return code


if __name__ == "__main__":
    sys.exit(main())
