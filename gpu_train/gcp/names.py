"""The names gpu-train gives Google Cloud resources, derived from the stack name (pure functions).

Compute Engine names (instances, firewall rules, resource policies, disks) are RFC 1035 labels of
at most 63 characters; a service account id has 6 to 30. A stack name may be longer or hold other
characters, so every name is built here: lower-cased, anything else turned into '-', and, when too
long, cut with a short hash of the whole name at the end, so that the same stack always gets the
same name and two long stacks never share one. A suffix (``ssh-ipv4``, ``placement``, a node's
number) is kept whole, so a name still says what it is. ``check`` runs in validation, so a name
Google would refuse stops `plan`, never `up` halfway.
"""

from __future__ import annotations

import hashlib
import re

from gpu_train.stack.problems import Problem

MAX_NAME = 63
SA_MIN, SA_MAX = 6, 30
RFC1035_RE = re.compile(r"[a-z](?:[-a-z0-9]*[a-z0-9])?")
SERVICE_ACCOUNT_RE = re.compile(r"[a-z][-a-z0-9]{4,28}[a-z0-9]")
FIREWALL_SUFFIXES = ("ssh-ipv4", "ssh-deny-ipv4", "ssh-ipv6", "ssh-deny-ipv6", "internal")
PLACEMENT_SUFFIX = "placement"


def rfc1035(text: str, max_len: int) -> str:
    """``text`` as a resource name of at most ``max_len``: lower case, digits and '-', starting with a letter."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = "g-" + name
    if len(name) > max_len:  # keep names unique when cut: end with a short hash of the whole
        digest = hashlib.sha256(text.encode()).hexdigest()[:6]
        name = name[: max_len - 7].rstrip("-") + "-" + digest
    return name.rstrip("-")


def resource_name(stack: str, suffix: str = "") -> str:
    """gpu-train-STACK[-SUFFIX], at most 63 characters, the suffix kept whole."""
    if not suffix:
        return rfc1035(f"gpu-train-{stack}", MAX_NAME)
    return f"{rfc1035(f'gpu-train-{stack}', MAX_NAME - len(suffix) - 1)}-{suffix}"


def instance_name(stack: str, node: int | None = None) -> str:
    """gpu-train-STACK for one VM; gpu-train-STACK-0 ... -N-1 for a cluster."""
    return resource_name(stack, "" if node is None else str(node))


def node_names(stack: str, nodes: int) -> list[str]:
    return [instance_name(stack)] if nodes == 1 else [instance_name(stack, i) for i in range(nodes)]


def data_disk_name(stack: str, node: int | None = None) -> str:
    """gpu-train-STACK-data (one VM), gpu-train-STACK-N-data (node N of a cluster)."""
    return resource_name(stack, "data" if node is None else f"{node}-data")


def network_tag(stack: str) -> str:
    return instance_name(stack)


def service_account_id(stack: str) -> str:
    """6 to 30 characters, as IAM requires."""
    return rfc1035(f"gpu-train-{stack}", SA_MAX).ljust(SA_MIN, "0")


def recovery_account_id(stack: str) -> str:
    """The recovery function's service account (infra/recovery.py): 6 to 30 characters."""
    return rfc1035(f"gpu-train-rec-{stack}", SA_MAX).ljust(SA_MIN, "0")


RECOVERY_SUFFIX = "recovery"
FUNCTION_NAME_MAX = 49  # Cloud Run names each revision NAME-00001-abc, 63 characters at most
GOOGLE_RE = re.compile(r"g[o0]{2}g[l1]e")  # Cloud Storage: no "google" (nor close misspellings) in a bucket name


def recovery_name(stack: str) -> str:
    """The recovery function's name, its topic's and its sink's (infra/recovery.py)."""
    return f"{rfc1035(f'gpu-train-{stack}', FUNCTION_NAME_MAX - len(RECOVERY_SUFFIX) - 1)}-{RECOVERY_SUFFIX}"


def recovery_bucket_name(stack: str, project: str) -> str:
    """The bucket the function's source is uploaded to: globally unique (a hash of project and stack), and
    never with "google" in it, which Cloud Storage refuses (a stack named my-google-run gave one)."""
    base = GOOGLE_RE.sub("gcp", recovery_name(stack)[:40]).rstrip("-")
    return f"{base}-{hashlib.sha256(f'{project}/{stack}'.encode()).hexdigest()[:12]}"


def recovery_build_account_id(stack: str) -> str:
    """The account the recovery function is built as (infra/recovery.py): 6 to 30 characters."""
    return rfc1035(f"gpu-train-bld-{stack}", SA_MAX).ljust(SA_MIN, "0")


def derived(stack: str, nodes: int = 1) -> dict[str, list[str]]:
    """Every name the program gives a resource of this stack, by kind."""
    return {
        "instance": node_names(stack, max(nodes, 1)),
        "firewall rule": [resource_name(stack, s) for s in FIREWALL_SUFFIXES],
        "placement policy": [resource_name(stack, PLACEMENT_SUFFIX)],
        "data disk": [data_disk_name(stack, None if nodes <= 1 else i) for i in range(max(nodes, 1))],
        "network tag": [network_tag(stack)],
        "service account id": [service_account_id(stack), recovery_account_id(stack), recovery_build_account_id(stack)],
        "bucket": [recovery_bucket_name(stack, "")],
    }


def check(stack: str, nodes: int = 1) -> list[Problem]:
    """A derived name Google would refuse (an error), or a note that long names were shortened."""
    problems = []
    for kind, names in derived(stack, nodes).items():
        pattern, limit = (SERVICE_ACCOUNT_RE, SA_MAX) if kind == "service account id" else (RFC1035_RE, MAX_NAME)
        for name in names:
            if kind == "bucket" and GOOGLE_RE.search(name):
                problems.append(Problem("stack", f"gives the bucket name {name!r}, which Cloud Storage refuses", "rename the stack", stack))
            elif not pattern.fullmatch(name) or len(name) > limit:
                problems.append(
                    Problem(
                        "stack",
                        f"gives the {kind} name {name!r}, which Google Cloud refuses",
                        "use a shorter stack name of letters, digits and '-'",
                        stack,
                    )
                )
    if not problems and rfc1035(f"gpu-train-{stack}", 10**6) != resource_name(stack):
        problems.append(
            Problem(
                "stack",
                f"is long: its resources are named {resource_name(stack)!r} and the like (cut, with a hash of the whole name)",
                "nothing to do; a shorter stack name reads better in the console",
                stack,
                "warning",
            )
        )
    return problems
