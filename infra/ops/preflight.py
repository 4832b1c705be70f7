"""``scripts/preflight``: will this stack fit in the project's quotas, and is its GPU offered there?

Reads, from the Compute API's REST interface with your Application Default Credentials: the
region's quotas (regions.get), the project's (projects.get: GPUS_ALL_REGIONS) and the accelerator
types of the zone (acceleratorTypes.list), and, for a stack that consumes a reservation, that reservation
(reservations.get in the stack's zone; where it is not there, aggregated/reservations says where it is).
Three GETs (four, five): no client library (google-cloud-compute took
2 s of CPU to import, on every `scripts/preflight` and `scripts/up`). Prints limit, usage and need for each
quota the VM counts against; for every shortfall, the exact quota and how to raise it.
Exit 0 when it fits, 1 when it cannot, 2 when the stack is invalid or the API cannot be reached.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from gpu_train import environment
from gpu_train.catalog.loader import load_catalog
from gpu_train.environment import Environment, SettingError
from gpu_train.errors import ExitStatus, outcome
from gpu_train.gcp import provisioning, quota, reservations, validate
from gpu_train.stack import stackfile
from gpu_train.stack.problems import ConfigError
from gpu_train.stack.settings import StackConfig
from infra.ops import probes

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

    from gpu_train.catalog.model import Catalog
    from gpu_train.gcp.validate import GpuShape


def _credentials(env: Environment) -> Credentials:
    """The user's Application Default Credentials; none only against another endpoint when there are none
    (a local API that asks for none)."""
    _, creds = probes.read_adc()
    if creds is not None:
        return creds
    if env.compute_endpoint != environment.COMPUTE:
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    import google.auth

    return google.auth.default(scopes=probes.SCOPES)[0]


def read_reservation(env: Environment, project: str, zone: str, name: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The reservation ``name`` of ``project`` in ``zone`` (reservations.get), or None and the zones that
    do hold one of that name (aggregated/reservations filtered by name). Raises RuntimeError otherwise."""
    creds = _credentials(env)
    try:
        return probes.get_json(creds, probes.compute_url(env, f"/compute/v1/projects/{project}/zones/{zone}/reservations/{name}")), []
    except RuntimeError as e:
        if not str(e).startswith("HTTP 404"):
            raise
    pages = probes.pages(
        creds, probes.compute_url(env, f"/compute/v1/projects/{project}/aggregated/reservations"), {"filter": f"name = {name}"}
    )
    return None, sorted(
        scope.split("/")[-1]
        for page in pages
        for scope, scoped in (page.get("items") or {}).items()
        if any(r.get("name") == name for r in scoped.get("reservations", []))
    )


def read_quotas(env: Environment, project: str, region: str, zone: str) -> tuple[dict[str, Any], dict[str, Any], set[str]]:
    """(region quotas, project quotas, accelerator types offered in the zone): one call each."""
    creds = _credentials(env)
    region_doc = probes.get_json(creds, probes.compute_url(env, f"/compute/v1/projects/{project}/regions/{region}"))
    project_doc = probes.get_json(creds, probes.compute_url(env, f"/compute/v1/projects/{project}"))
    accelerators = probes.compute_url(env, f"/compute/v1/projects/{project}/zones/{zone}/acceleratorTypes")
    offered = {a["name"] for page in probes.pages(creds, accelerators) for a in page.get("items", [])}

    def table(doc: dict[str, Any]) -> dict[str, tuple[float, float]]:
        return {q["metric"]: (float(q.get("limit", 0)), float(q.get("usage", 0))) for q in doc.get("quotas", [])}

    return table(region_doc), table(project_doc), offered


def offering_zones(env: Environment, project: str, machine_type: str, gpu_type: str) -> list[str]:
    """The zones that offer both the machine type and the GPU now (machineTypes and acceleratorTypes
    aggregated lists, filtered by name): the Compute API's answer, not the catalog's snapshot."""
    creds = _credentials(env)

    def zones(kind: str, name: str) -> set[str]:
        pages = probes.pages(
            creds, probes.compute_url(env, f"/compute/v1/projects/{project}/aggregated/{kind}"), {"filter": f"name = {name}"}
        )
        return {
            scope.split("/")[-1]
            for page in pages
            for scope, scoped in (page.get("items") or {}).items()
            if any(x.get("name") == name for x in scoped.get(kind, []))
        }

    return sorted(zones("machineTypes", machine_type) & zones("acceleratorTypes", gpu_type))


Reservation = tuple[dict[str, Any] | None, list[str]]  # read_reservation's answer


def report(
    cfg: StackConfig, region_q: dict[str, Any], global_q: dict[str, Any], offered: set[str], reservation: Reservation | None = None
) -> tuple[str, int]:
    catalog = load_catalog()
    shape = validate.shape_of(cfg, catalog)
    nodes = validate.node_shapes(cfg, catalog)
    rows = quota.evaluate(quota.needs(cfg, shape, region_q, catalog, nodes), region_q, global_q)
    what = (
        ", ".join(f"{p.count} x {p.role} {p.machine_type}" for p in cfg.pools)
        if cfg.pools
        else f"{cfg.nodes} x {shape.machine_type} ({shape.gpu_count} x {shape.gpu_type}, {provisioning.way(cfg)})"
    )
    lines = [
        f"Preflight of stack {cfg.stack}: project {cfg.project}, {cfg.zone}, {what}",
        "",
        f"  {'quota':<32}{'scope':<14}{'limit':>8}{'usage':>8}{'need':>8}  status",
    ]
    short = []
    for row in rows:
        n = row.need
        status = {True: "ok", False: "SHORT", None: "not listed"}[row.ok]

        def fmt(v: float | None) -> str:
            return "-" if v is None else f"{v:g}"

        lines.append(f"  {n.metric or '(per-family quota)':<32}{n.scope:<14}{fmt(row.limit):>8}{fmt(row.usage):>8}{n.amount:>8}  {status}")
        if n.note:
            lines.append(f"      {n.note}")
        if row.ok is False:
            short.append(quota.advice(row, cfg.project or ""))
        elif row.ok is None and n.scope != "global":
            maybe = "; it may use a per-family GPU quota" if n is rows[0].need else ""
            lines.append(
                f"      {n.what}: this project lists no {n.metric or 'per-model'} quota in {n.scope}{maybe}: check the Quotas page"
            )
    for gpu_type in sorted({n.gpu_type for n in nodes if n.gpu_count}):
        acc = catalog.accelerator(gpu_type)
        assert acc is not None  # a validated stack's GPUs are in the catalog
        if acc.name in offered:
            continue
        short.append(
            f"{acc.name} is not offered in {cfg.zone} for this project "
            f"(offered there: {', '.join(sorted(offered)) or 'no GPUs'}); pick another zone (scripts/plan suggests some)"
        )
    if reservation is not None and cfg.reservation:
        lines.append("")
        short += _reservation_lines(cfg, reservation, nodes, catalog, lines)
    lines.append("")
    if short:
        lines += ["The stack cannot fit:"] + [f"  - {s}" for s in short]
        return "\n".join(lines), ExitStatus.FAILED
    lines.append("The stack fits.")
    return "\n".join(lines), ExitStatus.OK


def _reservation_lines(cfg: StackConfig, found: Reservation, nodes: list[GpuShape], catalog: Catalog, lines: list[str]) -> list[str]:
    """The reservation's row in the report (appended to ``lines``), and its problems for 'cannot fit'."""
    assert cfg.reservation
    project, name = reservations.where(cfg.reservation, cfg.project or "")
    doc, elsewhere = found
    if doc is None:
        there = (
            f"; project {project} has one of that name in {', '.join(elsewhere)}: set gpu-train:zone to it"
            if elsewhere
            else f"; `gcloud compute reservations list --project={project}` lists those it has"
        )
        lines.append(f"  reservation {name} (project {project}): NOT FOUND in {cfg.zone}")
        return [f"reservation {name} does not exist in {cfg.zone} (project {project}){there}"]
    fit = reservations.fit(doc, nodes, catalog, cfg.reservation_bound)
    specific = doc.get("specificReservation") or {}
    lines.append(
        f"  reservation {name} (project {project}, {cfg.zone}): {doc.get('status', '?')}, "
        f"{specific.get('inUseCount', 0)} of {specific.get('count', 0)} VMs in use"
        + (", DENSE" if doc.get("deploymentType") == reservations.DENSE else "")
        + ": "
        + ("matches the shape" if not fit.errors else "DIFFERS")
    )
    lines += [f"      {w}" for w in fit.warnings]
    return fit.errors


def main(argv: list[str] | None = None, env: Environment | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/preflight", description=__doc__.split("\n\n")[0])
    p.add_argument("--stack", required=True)
    args = p.parse_args(argv)
    try:
        env = env or Environment.from_os()
        cfg, warnings = validate.check(stackfile.read_stack_file(env.stack_file(args.stack)), args.stack, load_catalog())
    except (ConfigError, SettingError) as e:
        status, message = outcome(e)
        print(message, file=sys.stderr)
        return status
    for w in warnings:  # the same warnings as scripts/plan (an example value still in the stack, ...)
        print(f"warning: {w}".replace("\n", "\n  "), file=sys.stderr)
    if not cfg.is_gcp:
        print(f"stack {args.stack} targets SSH hosts: no cloud quotas to check")
        return ExitStatus.OK
    try:
        region_q, global_q, offered = read_quotas(env, cfg.project or "", cfg.region, cfg.zone)
    except Exception as e:  # credentials, network, permissions: say which, and stop
        print(
            f"cannot read the project's quotas: {type(e).__name__}: {e}\n"
            "fix: `gcloud auth application-default login`, and check gcp:project",
            file=sys.stderr,
        )
        return ExitStatus.USAGE
    found = None
    if cfg.reservation:
        project, name = reservations.where(cfg.reservation, cfg.project or "")
        try:
            found = read_reservation(env, project, cfg.zone, name)
        except Exception as e:  # credentials, permissions on a shared reservation's project: say which
            print(
                f"cannot read reservation {name} of project {project}: {type(e).__name__}: {e}\n"
                "fix: `gcloud auth application-default login`; a shared reservation needs "
                "compute.reservations.get in its project",
                file=sys.stderr,
            )
            return ExitStatus.USAGE
    text, code = report(cfg, region_q, global_q, offered, found)
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
