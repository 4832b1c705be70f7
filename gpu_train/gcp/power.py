"""`vm-stop` / `vm-start`: the stack's `running` setting and a `pulumi up` aimed at its VMs only.

Stopping keeps the disks (Compute Engine's TERMINATED state bills only storage); the IaC way means
the stack file says what the VM should be, so a later `pulumi up` does not undo it. The `up` is
targeted at the instances (their URNs, which follow from the program's resource names), so nothing
else in the stack is touched, and it refreshes first: a VM stopped behind Pulumi's back (idle
auto-stop, maxRunHours, preemption) is seen as stopped, and `running: true` then starts it.

A shape with bundled Local SSD (A2 Ultra, A3, A4) is the exception: the provider's stop sends no
``discardLocalSsd``, which the Compute API requires of such a VM (a 400:
terraform-provider-google#26173), so the program leaves its power state alone (``ignoreChanges``) and the
task stops or starts it through the Compute API itself (``api_call``: ``instances.stop?discardLocalSsd=true``,
``instances.start``), then refreshes the instances' state (``refresh_command``: the new address).
"""

from __future__ import annotations

PROJECT = "gpu-train"  # Pulumi.yaml's name
COMPONENT_TYPE = "gpu-train:index:GpuVm"
COMPONENT_NAME = "gpu"  # infra/program.py: GpuVm("gpu", ...)
INSTANCE_TYPE = "gcp:compute/instance:Instance"


def instance_urns(stack: str, nodes: int, project: str = PROJECT) -> list[str]:
    """The URNs of the stack's instances: children of the GpuVm component, named like the VMs' nodes."""
    names = [COMPONENT_NAME] if nodes == 1 else [f"{COMPONENT_NAME}-{i}" for i in range(nodes)]  # infra/gpu_vm.py
    return [f"urn:pulumi:{stack}::{project}::{COMPONENT_TYPE}${INSTANCE_TYPE}::{n}" for n in names]


def commands(stack: str, running: bool, nodes: int) -> list[list[str]]:
    """The Pulumi CLI calls that stop (running=False) or start the stack's VMs, in order."""
    up = ["pulumi", "up", "--yes", "--skip-preview", "--refresh", "--stack", stack]
    for urn in instance_urns(stack, nodes):
        up += ["--target", urn]
    return [["pulumi", "config", "set", "gpu-train:running", "true" if running else "false", "--stack", stack], up]


def refresh_command(stack: str, nodes: int) -> list[str]:
    """A refresh of the stack's instances only: the state learns the status and the address they have now."""
    out = ["pulumi", "refresh", "--yes", "--skip-preview", "--stack", stack]
    for urn in instance_urns(stack, nodes):
        out += ["--target", urn]
    return out


def api_call(project: str, zone: str, name: str, running: bool) -> tuple[str, dict[str, str]]:
    """(path, query) of the Compute API call that starts or stops a VM with Local SSD: a stop discards it
    (the VM keeps its boot and data disks; the Local SSD holds nothing of gpu-train's)."""
    path = f"/compute/v1/projects/{project}/zones/{zone}/instances/{name}/{'start' if running else 'stop'}"
    return path, ({} if running else {"discardLocalSsd": "true"})


def refusal(running_runs: list[str], unreachable: list[str], force: bool, stack: str, cli: str) -> str | None:
    """Why vm-stop must not stop now (the same guard as `fab down`), or None; ``cli``: the command
    the user runs (gpu-train or fab), for the fixes."""
    if force:
        return None
    if running_runs:
        return (
            f"refusing: still running: {', '.join(running_runs)} ({cli} stop --stack {stack} first, or {cli} vm-stop --force; "
            "a stopped VM keeps its disk and its runs resume at the next start)"
        )
    if unreachable:
        return f"refusing: cannot check the runs ({'; '.join(unreachable)}); {cli} vm-stop --force to stop anyway"
    return None
