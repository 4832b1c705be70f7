"""`gpu-train check`: is this machine set up for the GCP path? Pure judgements of probed facts.

Each prerequisite becomes one Finding (pass, fail, or not checked because an earlier one is
missing) with the fix for a failure. The probes (the Pulumi CLI, the ADC file, Google's APIs)
live in ``infra.ops.probes``; nothing here runs a process or opens a socket, so every combination of
present and missing is a row in a table test.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from gpu_train.errors import ExitStatus

MIN_PULUMI = (3, 200, 0)  # the pulumi SDK range in pyproject.toml starts here
SERVICES = {
    "compute.googleapis.com": "Compute Engine API",
    "cloudquotas.googleapis.com": "Cloud Quotas API",
}


@dataclass(frozen=True)
class Finding:
    what: str
    ok: bool | None  # None: not checked (something it needs is missing), or nothing to check
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def pulumi_cli(version_output: str | None) -> Finding:
    """``pulumi version``'s output, or None when no ``pulumi`` is on PATH."""
    if version_output is None:
        return Finding(
            "Pulumi CLI",
            False,
            "not found on PATH",
            "install it: https://www.pulumi.com/docs/iac/download-install/ (SSH stacks do not need it)",
        )
    m = re.search(r"v?(\d+)\.(\d+)\.(\d+)", version_output)
    if not m:
        return Finding("Pulumi CLI", False, f"cannot read its version from {version_output.strip()[:80]!r}", "reinstall the Pulumi CLI")
    version = tuple(int(x) for x in m.groups())
    shown = ".".join(map(str, version))
    if version < MIN_PULUMI:
        return Finding(
            "Pulumi CLI",
            False,
            f"v{shown} is older than v{'.'.join(map(str, MIN_PULUMI))}",
            "upgrade: pulumi self-update (or your package manager)",
        )
    return Finding("Pulumi CLI", True, f"v{shown}")


def backend(cli_found: bool, whoami: tuple[int, str, str] | None) -> Finding:
    """``pulumi whoami --verbose``: (exit status, stdout, stderr)."""
    if not cli_found or whoami is None:
        return Finding("Pulumi backend", None, "not checked (no Pulumi CLI)")
    code, out, err = whoami
    if code != 0:
        reason = (err or out).strip().splitlines()[-1:] or ["not logged in"]
        return Finding(
            "Pulumi backend",
            False,
            f"not logged in ({reason[0][:160]})",
            "pulumi login (Pulumi Cloud), or a local backend: pulumi login --local",
        )
    user = re.search(r"^User:\s*(.+)$", out, re.M)
    url = re.search(r"^Backend URL:\s*(.+)$", out, re.M)
    who = user.group(1).strip() if user else out.strip().splitlines()[0] if out.strip() else "?"
    return Finding("Pulumi backend", True, f"{who} at {url.group(1).strip()}" if url else who)


@dataclass(frozen=True)
class Adc:
    """What the Application Default Credentials file says (or why it could not be read)."""

    path: str
    exists: bool
    kind: str | None = None  # authorized_user, service_account, external_account, ...
    project: str | None = None
    error: str | None = None


def credentials(adc: Adc) -> Finding:
    if not adc.exists:
        return Finding(
            "Application Default Credentials",
            False,
            f"no file at {adc.path}",
            "gcloud auth application-default login (or set GOOGLE_APPLICATION_CREDENTIALS to a key file)",
        )
    if adc.error:
        return Finding(
            "Application Default Credentials",
            False,
            f"{adc.path} cannot be used: {adc.error}",
            "gcloud auth application-default login, to write a fresh one",
        )
    where = f"project {adc.project}" if adc.project else "no project of its own (the stacks' gcp:project is used)"
    return Finding("Application Default Credentials", True, f"{adc.kind} in {adc.path}; {where}")


def apis(project: str, states: dict[str, str] | None, error: str | None, have_credentials: bool) -> list[Finding]:
    """One Finding per API the GCP path needs in ``project``, from Service Usage's answer."""
    out = []
    for service, title in SERVICES.items():
        what = f"{title} in {project}"
        if not have_credentials:
            out.append(Finding(what, None, "not checked (no credentials)"))
        elif error is not None:
            out.append(
                Finding(
                    what,
                    False,
                    f"cannot ask Service Usage: {error}",
                    "check gcp:project and that your account may view it (roles/serviceusage.serviceUsageViewer)",
                )
            )
        elif (states or {}).get(service) == "ENABLED":
            out.append(Finding(what, True, "enabled"))
        else:
            out.append(
                Finding(
                    what,
                    False,
                    f"{(states or {}).get(service, 'unknown').lower()}",
                    f"gcloud services enable {service} --project {project}",
                )
            )
    return out


def ssh_key(stack: str, private_key: str, private_exists: bool, public_problem: str | None) -> Finding:
    """The key a stack logs in with: its private half here, and (GCP) its public half readable."""
    what = f"SSH key of {stack}"
    if not private_exists:
        return Finding(
            what, False, f"no private key at {private_key}", "ssh-keygen -t ed25519 (or set gpu-train:sshKey / sshPublicKey to your key)"
        )
    if public_problem:
        return Finding(what, False, public_problem, "set gpu-train:sshPublicKey to your public key or its path")
    return Finding(what, True, private_key)


def stack_file(
    stack: str,
    target: str | None,
    problems: str | None,
    deployed: bool | None,
    how: str,
    plan: str = "scripts/plan",
    up: str = "scripts/up",
) -> Finding:
    """A stack file: valid or not; for GCP stacks whether it is deployed (``how`` says how we know).
    ``plan`` and ``up``: how this clone's scripts are run from where the user is (``project.repo_script``)."""
    what = f"stack {stack}"
    if problems is not None:
        first = problems.splitlines()[1:2] or [problems]
        return Finding(
            what, False, f"invalid: {first[0].strip().removeprefix('- ')}", f"{plan} --stack {stack} lists every problem and its fix"
        )
    if target == "ssh":
        return Finding(what, True, f"valid (SSH stack{how and ': ' + how})")
    if deployed is None:
        return Finding(what, True, f"valid; deployed: unknown ({how})")
    state = "deployed" if deployed else f"not deployed ({up} --stack {stack}, or pulumi up)"
    return Finding(what, True, f"valid; {state} ({how})")


def bucket_access(stack: str, url: str, answer: dict[str, Any] | None, error: str | None) -> Finding:
    """An SSH stack's bucket as its host's uploader will use it: ``answer`` is the host's BucketProbe
    (gpu_train.contract), ``error`` why the host could not be asked."""
    what = f"bucket of {stack} ({url})"
    if answer is None:
        return Finding(what, None, f"not checked: the host cannot be asked ({error})")
    python = answer.get("python", "the job's Python")
    if answer.get("ok"):
        return Finding(
            what,
            True,
            f"{python} wrote, read and deleted {answer.get('object', 'an object')}; credentials: {answer.get('credentials', '?')}",
        )
    detail, member = f"{answer.get('detail', '')} (with {python})", answer.get("member") or "MEMBER"
    name = url.removeprefix("gs://").split("/", 1)[0]
    step = answer.get("step")
    if step == "client":
        return Finding(
            what,
            False,
            detail,
            f"on the host: {python} -m pip install google-cloud-storage (or list "
            "google-cloud-storage in the project's requirements.txt, which runs install)",
        )
    if step == "credentials":
        return Finding(
            what,
            False,
            f"no usable credentials on the host: {detail}",
            "on the host: gcloud auth application-default login (your account), or a service account's key: "
            "export GOOGLE_APPLICATION_CREDENTIALS=/path/to/key.json where its SSH sessions get it (~/.bashrc, "
            "above any return for non-interactive shells)",
        )
    if step == "bucket":
        return Finding(
            what,
            False,
            f"no bucket {name}: {detail}",
            f"create it (gcloud storage buckets create gs://{name} --uniform-bucket-level-access), or set "
            "gpu-train:bucket to one that exists",
        )
    if step == "access":
        return Finding(
            what,
            False,
            f"no access to objects in {name}: {detail}",
            f"gcloud storage buckets add-iam-policy-binding gs://{name} --member={member} "
            "--role=roles/storage.objectUser (object read, write, delete; that bucket only)"
            + ("" if answer.get("member") else "; MEMBER: user:YOU@DOMAIN or serviceAccount:EMAIL, the credentials named"),
        )
    return Finding(what, False, detail, "the host must reach storage.googleapis.com over HTTPS (port 443): a proxy or firewall in the way?")


def exit_code(findings: list[Finding]) -> int:
    return ExitStatus.FAILED if any(f.ok is False for f in findings) else ExitStatus.OK


def render(findings: list[Finding]) -> str:
    marks = {True: "ok  ", False: "FAIL", None: "--  "}
    lines = []
    for f in findings:
        lines.append(f"  {marks[f.ok]}  {f.what}: {f.detail}")
        if f.ok is False and f.fix:
            lines.append(f"        fix: {f.fix}")
    failed = sum(f.ok is False for f in findings)
    lines.append("")
    lines.append(
        "everything the GCP path needs is in place"
        if not failed
        else f"{failed} thing{'s' * (failed != 1)} missing (SSH stacks need only their key and the host)"
    )
    return "\n".join(lines)
