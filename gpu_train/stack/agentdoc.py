"""The agent's settings document a stack gives its hosts (contract.AgentSettings): REMOTE_ROOT/agent.json
on every host, /etc/gpu-train/agent.json on a VM (gpu_train/gcp/vm.py root_settings). Every stack's
tasks build it, so it is here, apart from Compute Engine's rules, which an SSH stack never loads."""

from __future__ import annotations

from gpu_train.stack.settings import StackConfig

# How long Compute Engine lets the guest shut down before a hard power-off: "120 seconds ... for
# Standard VMs and 30 seconds for Spot VMs" (pulumi-gcp 10.2.0 Instance scheduling.skipGuestOsShutdown
# doc; Compute Engine "Spot VMs", preemption process; read 2026-11-22).
SHUTDOWN_GRACE_S = {True: 30, False: 120}


def shutdown_grace_s(spot: bool) -> int:
    """Seconds a job has to checkpoint when the VM stops or is preempted."""
    return SHUTDOWN_GRACE_S[spot]


def job_grace_s(cfg: StackConfig) -> int:
    """Seconds a job has between SIGTERM and SIGKILL when the machine goes down: within Compute
    Engine's window (``shutdown_grace_s``), leaving the rest of the shutdown a few seconds. SSH
    hosts: under systemd's default stop timeout (90 s)."""
    if not cfg.is_gcp:
        return 80
    return shutdown_grace_s(cfg.spot) - (5 if cfg.spot else 10)


def agent_settings(cfg: StackConfig, **host: object) -> dict[str, object]:
    """The agent's settings from this stack, as a host gets them (contract.AgentSettings' document): the
    stack's own, the job's shutdown grace, and ``host``'s (its sshPort; a VM's root copy: whose root)."""
    return {**cfg.agent_settings(), "shutdownGraceS": job_grace_s(cfg), **host}
