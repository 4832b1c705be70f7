"""`vm-stop` / `vm-start`: stop a stack's VMs keeping their disks, and start them again, the IaC way.

The stack's `running` setting is set (so the stack file says what the VM is) and a `pulumi up`
aimed at the instances only makes it so (``gpu_train.gcp.power``). Stopping first does what `fab down`
does before destroying: it refuses while a run is running, and fetches every run of every node.
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING, Any

from invoke import Context, task

from gpu_train.contract import ACTIVE
from gpu_train.environment import Environment
from gpu_train.errors import CommandFailed, GpuTrainError, UsageError, outcome
from gpu_train.stack.problems import ConfigError
from remote.tasks.session import CLI, STACK_HELP, Session, say
from remote.tasks.trust import number

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

    from gpu_train.stack.settings import StackConfig

GUARD_TIMEOUT_S = 10.0  # how long vm-stop tries to reach the host to check its runs


def _gcp_config(env: Environment, stack: str | None) -> StackConfig:
    from gpu_train.catalog.loader import load_catalog
    from gpu_train.stack import stackfile
    from remote.ssh import target as targets

    try:
        name = targets.select_stack(env, stack)
        cfg = stackfile.load_stack(name, load_catalog(), env.stack_dirs, env.cli)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if not cfg.is_gcp:
        raise UsageError(f"stack {name} is an SSH stack: gpu-train does not power your own hosts on or off")
    return cfg


def _pulumi(env: Environment, commands: list[list[str]]) -> None:
    from remote.ssh import target as targets

    for argv in commands:
        say("$ " + " ".join(argv))
        result = subprocess.run(argv, cwd=targets.REPO, stdin=subprocess.DEVNULL, env={**os.environ, **env.exported()})
        if result.returncode != 0:
            raise CommandFailed(
                f"`{' '.join(argv[:4])} ...` failed (exit {result.returncode}): see its output above; once "
                "fixed, run the task again (it is safe to repeat)",
                command=" ".join(argv),
                exited=result.returncode,
            )


@task(
    name="vm-stop",
    help={
        "force": "stop even while a run is running or the host cannot be checked",
        "wait": f"seconds to try reaching the host to check its runs (default {GUARD_TIMEOUT_S:g})",
        "stack": STACK_HELP,
    },
)
def vm_stop(c: Context, force: bool = False, wait: str | None = None, stack: str | None = None) -> None:
    """Stop the stack's VM(s), keeping the disks (only storage bills while stopped); fetches every run first.

    Refuses while a run is running or the host cannot be checked, unless --force (which skips the check
    and the fetch: a running run gets SIGTERM, saves a checkpoint and resumes at vm-start).
    """
    from gpu_train.gcp import power
    from remote.tasks.teardown import every_node_status, fetch_every_node, guard_runs, refusal

    wait_s = number("--wait", GUARD_TIMEOUT_S if wait is None else wait, float, 0.1, 3600)
    env = Environment.of(c)
    cfg = _gcp_config(env, stack)
    runs: list[dict[str, Any]] = []
    unreachable: list[str] = []
    sessions: list[Session] = []
    docs: list[object] = []
    if force:
        say("--force: not checking or fetching the runs (the disk keeps them; running ones resume at vm-start)")
    elif _vm_is_down(env, cfg):
        say(f"the Compute API says no VM of {cfg.stack} is running: nothing to fetch first")
    else:
        try:
            sessions, docs = every_node_status(Session(env, cfg.stack, timeout=wait_s))
            runs, unreachable = guard_runs(sessions, docs)
            if len(docs) == 1 and isinstance(docs[0], GpuTrainError):
                raise docs[0]
        except GpuTrainError as e:
            unreachable = [outcome(e)[1].splitlines()[0]]
    running = [r["id"] for r in runs if r["state"] in ACTIVE]
    try:
        reason = power.refusal(running, unreachable, force, cfg.stack, CLI)
        if reason:
            raise GpuTrainError(reason)
        problems = fetch_every_node(sessions, docs) if sessions and not unreachable else []
        if problems:
            raise GpuTrainError(refusal(problems, "stopped", f"{CLI} vm-stop --force"))
    finally:
        for s in sessions:
            s.close()
    creds = _api_credentials(cfg, running=False) if _local_ssd(cfg) else None  # before anything is changed
    _pulumi(env, power.commands(cfg.stack, False, cfg.nodes))
    if creds is not None:
        _power_by_api(env, cfg, creds, running=False)
        say("(the shape's bundled Local SSD was discarded at this stop; runs live on the data disk)")
    print(f"stopped {cfg.stack}: disks kept, gpu-train:running is false; `{CLI} vm-start --stack {cfg.stack}` starts it again")


def _local_ssd(cfg: StackConfig) -> bool:
    from gpu_train.catalog.loader import load_catalog
    from gpu_train.gcp import vm

    return vm.has_local_ssd(cfg, load_catalog())


POWER_TIMEOUT_S = 600.0  # how long a stop or start of a VM may take before the task says so


def _api_credentials(cfg: StackConfig, running: bool) -> Credentials:
    """Your Application Default Credentials, for the Compute API calls of a Local SSD shape (refused, saying
    how to get them, before anything changes)."""
    from infra.ops import probes

    _, creds = probes.read_adc()
    if creds is None or not cfg.project:
        raise UsageError(
            f"{cfg.stack}'s VMs have bundled Local SSD: Pulumi's provider cannot {'start' if running else 'stop'} them "
            "(terraform-provider-google#26173), the task does it through the Compute API, which needs your Application "
            "Default Credentials: run `gcloud auth application-default login`, then this again"
        )
    return creds


def _power_by_api(env: Environment, cfg: StackConfig, creds: Credentials, running: bool) -> None:
    """Stop (discarding Local SSD) or start each node through the Compute API, wait for each, then refresh the
    instances' state: the provider cannot stop a VM with Local SSD (terraform-provider-google#26173)."""
    from gpu_train.gcp import names, power
    from infra.ops import probes

    assert cfg.project  # (_api_credentials refused a stack without one)
    for name in names.node_names(cfg.stack, cfg.nodes):
        path, query = power.api_call(cfg.project, cfg.zone, name, running)
        say(f"$ POST {path}" + "".join(f"?{k}={v}" for k, v in query.items()))
        try:
            probes.operation_done(env, creds, probes.post_json(creds, probes.compute_url(env, path), query), POWER_TIMEOUT_S)
        except RuntimeError as e:
            raise CommandFailed(
                f"the Compute API did not {'start' if running else 'stop'} {name}: {e}; once fixed, run the task again "
                "(it is safe to repeat)",
                command=f"POST {path}",
                exited=1,
            ) from None
    _pulumi(env, [power.refresh_command(cfg.stack, cfg.nodes)])


def _vm_is_down(env: Environment, cfg: StackConfig) -> bool:
    """True when the Compute API (with your credentials) says none of the stack's VMs runs."""
    from gpu_train.gcp.vm import label_value
    from infra.ops import probes

    _, creds = probes.read_adc()
    if creds is None or not cfg.project:
        return False
    try:
        mine = [
            i
            for i in probes.gpu_train_instances(env, creds, cfg.project)
            if (i.get("labels") or {}).get("gpu-train-stack") == label_value(cfg.stack)
        ]
    except RuntimeError:
        return False
    return not any(i.get("status") == "RUNNING" for i in mine)


@task(name="vm-start", help={"stack": STACK_HELP})
def vm_start(c: Context, stack: str | None = None) -> None:
    """Start the stack's stopped VM(s) again (after vm-stop, idle auto-stop, maxRunHours or preemption)."""
    from gpu_train.gcp import power
    from remote.ssh import target as targets

    env = Environment.of(c)
    cfg = _gcp_config(env, stack)
    creds = _api_credentials(cfg, running=True) if _local_ssd(cfg) else None
    _pulumi(env, power.commands(cfg.stack, True, cfg.nodes))
    if creds is not None:
        _power_by_api(env, cfg, creds, running=True)
    try:  # a restarted VM may have a new address
        outputs = targets.stack_outputs(cfg.stack, env.state_home / cfg.stack, refresh=True)
    except ConfigError as e:
        raise GpuTrainError(str(e)) from None
    print(
        f"started {cfg.stack} at {outputs.get('externalIp')}; runs it was running resume by themselves (`{CLI} status --stack {cfg.stack}`)"
    )
