"""Gather the facts behind `check` and `ls`, across every stack file, quickly and without failing.

The judgements are pure (``gpu_train.views.checkup``, ``gpu_train.views.listing``); this module only asks:
the probes in ``infra.ops.probes`` (Pulumi CLI, ADC file, Service Usage, Compute API: one call per
project), the local caches (last known stack outputs, the uptime ledger), and for hosts believed
up, the agent's status over SSH with a short timeout, all hosts at once.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_train.atomic import atomic_write
from gpu_train.catalog.loader import load_catalog
from gpu_train.environment import Environment
from gpu_train.gcp import validate
from gpu_train.gcp.vm import label_value
from gpu_train.stack import stackfile
from gpu_train.stack.problems import ConfigError
from gpu_train.stack.project import listed_stack_files, repo_script
from gpu_train.stack.settings import StackConfig
from gpu_train.views import checkup, listing
from infra.ops import probes

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

QUICK_SSH_S = 5.0  # how long `ls` tries to connect to a host
ANSWER_S = 30.0  # and how long it waits for all the hosts' answers, all asked at once


def stack_files(env: Environment) -> list[Path]:
    return listed_stack_files(env.project_root, env.stacks_dir)


def load(path: Path) -> tuple[str, StackConfig | None, str | None]:
    """(name, config or None, the problems' text or None)."""
    name = stackfile.stack_name_from_path(path)
    try:
        cfg, _ = validate.check(stackfile.read_stack_file(path), name, load_catalog())
        return name, cfg, None
    except ConfigError as e:
        return name, None, str(e)


def cached_outputs(home: Path, stack: str) -> dict[str, Any] | None:
    try:
        doc = json.loads((home / stack / "outputs.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


# -- check ----------------------------------------------------------------------------------------
def check_findings(env: Environment) -> list[checkup.Finding]:
    home = env.state_home
    findings = []
    version = probes.pulumi_version()
    findings.append(checkup.pulumi_cli(version))
    backend = checkup.backend(version is not None, probes.pulumi_whoami() if version is not None else None)
    findings.append(backend)
    adc, creds = probes.read_adc()
    findings.append(checkup.credentials(adc))
    stacks = [load(p) for p in stack_files(env)]
    projects = sorted({cfg.project for _, cfg, _ in stacks if cfg and cfg.is_gcp and cfg.project}) or ([adc.project] if adc.project else [])
    for project in projects:
        states, error = None, None
        if creds is not None:
            try:
                states = probes.services_state(env, creds, project, list(checkup.SERVICES))
            except RuntimeError as e:
                error = str(e)
        findings += checkup.apis(project, states, error, creds is not None)
    if not projects:
        findings.append(checkup.Finding("Google APIs", None, "not checked (no GCP stack and no project in the ADC)"))
    deployed_in_backend = probes.pulumi_stacks() if backend.ok else None
    keys: dict[tuple[str, str | None], list[str]] = {}
    for name, cfg, _ in stacks:
        if cfg is None:
            continue
        private = os.path.expanduser(cfg.ssh_private_key_path() if cfg.is_gcp else (cfg.ssh_key or "~/.ssh/id_ed25519"))
        problem = stackfile.read_public_key(cfg)[1] if cfg.is_gcp else None
        keys.setdefault((private, problem.message if problem else None), []).append(name)
    for (private, problem_text), names in keys.items():
        findings.append(checkup.ssh_key(", ".join(names), private, Path(private).is_file(), problem_text))
    for name, cfg, _ in stacks:  # SSH stacks' buckets: the host's own credentials (a GCP VM's: the stack grants them)
        if cfg is not None and not cfg.is_gcp and cfg.bucket:
            findings.append(
                checkup.bucket_access(
                    name, cfg.bucket if cfg.bucket.startswith("gs://") else f"gs://{cfg.bucket}", *_bucket_probe(name, cfg, home, env.cli)
                )
            )
    scripts = (repo_script("plan"), repo_script("up"))  # as they run from here (the user's project has no scripts/)
    for name, cfg, problems in stacks:
        if cfg is None or not cfg.is_gcp:
            how = f"{len(cfg.hosts)} host(s)" if cfg else ""
            findings.append(checkup.stack_file(name, cfg.target if cfg else None, problems, None, how, *scripts))
            continue
        if deployed_in_backend is not None:
            info = deployed_in_backend.get(name)
            deployed, how = (bool(info.get("resourceCount")), "backend") if info else (False, "no such stack in the backend")
        elif cached_outputs(home, name) is not None:
            deployed, how = True, "last known outputs"
        else:
            deployed, how = None, "no backend to ask"
        findings.append(checkup.stack_file(name, "gcp", None, deployed, how, *scripts))
    if not stacks:
        findings.append(checkup.Finding("stack files", None, f"none in {env.stack_dirs[0]} ({env.cli} init writes one)"))
    return findings


# -- ls -------------------------------------------------------------------------------------------
class Ledger:
    """The local record of a stack's VM uptime intervals (epoch seconds), for "spent this month"."""

    def __init__(self, home: Path, stack: str):
        self.path = home / stack / "uptime.json"

    def read(self) -> tuple[listing.Interval, ...]:
        try:
            return tuple((float(s), float(e)) for s, e in json.loads(self.path.read_text())["intervals"])
        except (OSError, ValueError, KeyError, TypeError):
            return ()

    def write(self, intervals: tuple[listing.Interval, ...]) -> None:
        keep = [iv for iv in intervals if iv[1] > time.time() - 400 * 86400]  # a year and a bit is enough
        atomic_write(self.path, json.dumps({"intervals": keep}))


def _instances_by_stack(
    env: Environment, creds: Credentials, projects: set[str]
) -> tuple[dict[tuple[str, str], list[dict[str, Any]]], dict[str, str]]:
    """{(project, stack label): instances}, {project: error}: one aggregated list per project."""
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    errors: dict[str, str] = {}
    for project in sorted(projects):
        try:
            for inst in probes.gpu_train_instances(env, creds, project):
                label = (inst.get("labels") or {}).get("gpu-train-stack", "")
                found.setdefault((project, label), []).append(inst)
        except RuntimeError as e:
            errors[project] = str(e)
    for insts in found.values():
        insts.sort(key=lambda i: int((i.get("labels") or {}).get("gpu-train-node", "0") or 0))
    return found, errors


def _quick_status(cfg: StackConfig, outputs: dict[str, Any] | None, home: Path, cli: str) -> tuple[dict[str, Any] | None, str | None]:
    """Node 0's agent status within QUICK_SSH_S, or why not."""
    from remote.ssh import agentcall
    from remote.ssh import connect as ssh
    from remote.ssh.target import ssh_hosts, target_from

    try:
        target = target_from(cfg if cfg.is_gcp else ssh_hosts(cfg), outputs, home, cli)
        if target.key_file and not Path(target.key_file).is_file():
            return None, f"no private key at {target.key_file}"
        conn = ssh.open_connection(target, target.host, QUICK_SSH_S, lambda _text: None)
        try:
            return agentcall.call(conn, target, "status"), None
        finally:
            conn.close()
    except Exception as e:  # any failure is this stack's "?", never the whole listing's
        return None, str(e).splitlines()[0][:160] if str(e) else type(e).__name__


def _bucket_probe(stack: str, cfg: StackConfig, home: Path, cli: str) -> tuple[dict[str, Any] | None, str | None]:
    """Node 0's answer to `bucket-check` (the uploader's Python and login environment), or why none."""
    from gpu_train.stack.bucket import area_of, parse_bucket, stack_prefix
    from remote.ssh import agentcall
    from remote.ssh import connect as ssh
    from remote.ssh.target import ssh_hosts, target_from

    place = parse_bucket(cfg.bucket or "")
    try:
        target = target_from(ssh_hosts(cfg), cached_outputs(home, stack), home, cli)
        conn = ssh.open_connection(target, target.host, QUICK_SSH_S, lambda _text: None)
        try:
            return agentcall.call(
                conn,
                target,
                "bucket-check",
                "--bucket",
                place.name,
                "--prefix",
                stack_prefix(place, area_of(stack, cfg.bucket_area)),
                *(["--python", cfg.python] if cfg.python else []),
                timeout=ANSWER_S + 90,
            ), None
        finally:
            conn.close()
    except Exception as e:  # this stack's "not checked", never the whole check's
        return None, str(e).splitlines()[0][:160] if str(e) else type(e).__name__


def ls_facts(env: Environment, ask_hosts: bool = True) -> list[listing.StackFacts]:
    home = env.state_home
    stacks = [load(p) for p in stack_files(env)]
    gcp = [(n, c) for n, c, _ in stacks if c is not None and c.is_gcp]
    projects = {c.project for _, c in gcp if c.project}
    adc, creds = probes.read_adc() if gcp else (None, None)
    by_stack, api_errors = _instances_by_stack(env, creds, projects) if creds is not None else ({}, {})
    facts: dict[str, listing.StackFacts] = {}
    for name, cfg, problem in stacks:
        if cfg is None:
            facts[name] = listing.StackFacts(name, problem=problem)
            continue
        outputs = cached_outputs(home, name) if cfg.is_gcp else None
        instances, api_error = None, None
        if cfg.is_gcp:
            if creds is None:
                api_error = "no credentials (gcloud auth application-default login)" if adc is not None else None
            elif cfg.project in api_errors:
                api_error = api_errors[cfg.project]
            else:
                instances = by_stack.get((cfg.project or "", label_value(name)), [])
        facts[name] = listing.StackFacts(
            name, cfg, outputs=outputs, instances=instances, api_error=api_error, ledger=Ledger(home, name).read()
        )
    # The agents of hosts believed up, all at once and briefly.
    asks = {n: f for n, f in facts.items() if ask_hosts and f.cfg is not None and _worth_asking(f)}
    answers: dict[str, tuple[dict[str, Any] | None, str | None]] = {}

    def ask(name: str) -> None:
        cfg = asks[name].cfg
        assert cfg is not None  # only stacks that parsed are asked
        answers[name] = _quick_status(cfg, asks[name].outputs, home, env.cli)

    threads = [threading.Thread(target=ask, args=(n,), daemon=True) for n in asks]
    for t in threads:
        t.start()
    deadline = time.monotonic() + ANSWER_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    out = []
    now = env.clock()
    for name, f in facts.items():
        late = (None, f"no answer within {ANSWER_S:g} s") if name in asks else (None, None)
        status, error = answers.get(name, late)
        f = listing.StackFacts(**{**f.__dict__, "status": status, "status_error": error})
        if f.cfg is not None and f.cfg.is_gcp:
            Ledger(home, name).write(listing.observed(f, now))
        out.append(f)
    return out


def _worth_asking(f: listing.StackFacts) -> bool:
    if f.cfg is None:
        return False
    if not f.cfg.is_gcp:
        return bool(f.cfg.hosts)
    if not (f.outputs and f.outputs.get("externalIp")):
        return False
    if f.instances is not None:
        return any(i.get("status") == "RUNNING" for i in f.instances)
    return f.cfg.running
