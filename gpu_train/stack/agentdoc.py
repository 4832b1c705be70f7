"""The agent's settings document a stack gives its hosts (contract.AgentSettings): REMOTE_ROOT/agent.json
on every host, /etc/gpu-train/agent.json on a VM (gpu_train/gcp/vm.py root_settings). Every stack's
tasks build it, so it is here, apart from Compute Engine's rules, which an SSH stack never loads."""

from __future__ import annotations

from gpu_train.contract import AgentSettings
from gpu_train.stack.settings import SETTINGS, StackConfig

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


# The agent's settings the stack decides: its settings marked ``agent`` (each named as its AgentSettings
# field), whether the host is a VM, the job's shutdown grace, the host's SSH port; what else a host's
# agent.json holds (poweroffCommand, metadataUrl) stays as it is there.
STACK_PART = (*(s.attr for s in SETTINGS if s.agent), "gcp", "shutdown_grace_s", "ssh_port")
# A VM's root copy (gcp/vm.py root_settings): the same but the port (its units count every sshd session),
# and whose REMOTE_ROOT it serves.
ROOT_PART = (*STACK_PART[:-1], "user", "remote_root")


def agent_settings(cfg: StackConfig, ssh_port: int = 22) -> AgentSettings:
    """The agent's settings from this stack, built here alone (a host gets ``settings_part`` of them); a
    setting marked ``agent`` that names no AgentSettings field fails here."""
    own = {s.attr: getattr(cfg, s.attr) for s in SETTINGS if s.agent}
    return AgentSettings(**own, gcp=cfg.is_gcp, shutdown_grace_s=job_grace_s(cfg), ssh_port=ssh_port)


def settings_part(conf: AgentSettings) -> dict[str, object]:
    """What a host gets of ``conf`` (`setup`'s configure, `train`'s spec): the stack's part, merged there into
    REMOTE_ROOT/agent.json."""
    return conf.to_json(only=STACK_PART)
