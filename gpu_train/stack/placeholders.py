"""Values that are examples, not settings: a stack that still holds one is warned about.

A starter stack (`gpu-train init --gcp-project`), the README and the imports all write example
values for the user to replace: an SSH source range from the address blocks reserved for
documentation, and project ids such as ``my-proj``. A documentation range is never a real source
address (RFC 5737, RFC 3849), so a VM whose firewall admits only it is one nobody can reach; an
example project id is someone else's project, or none. Both pass every syntax rule, so they are
said here, as warnings that name the setting and how to find the real value.
"""

from __future__ import annotations

import ipaddress

from gpu_train.stack.problems import Problem

# Reserved for documentation: no packet from the internet comes from these.
DOCUMENTATION_V4 = tuple(ipaddress.IPv4Network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"))
DOCUMENTATION_V6 = (ipaddress.IPv6Network("2001:db8::/32"),)
# The project ids our own docs and examples use for "your project here".
EXAMPLE_PROJECTS = frozenset(
    {"my-proj", "my-project", "my-gcp-project", "my-project-id", "your-project", "your-project-id", "project-id", "example-project"}
)


def is_documentation_range(text: str) -> bool:
    """Whether a CIDR lies wholly inside a documentation block (False for what is not a CIDR)."""
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    if isinstance(net, ipaddress.IPv4Network):
        return any(net.subnet_of(doc) for doc in DOCUMENTATION_V4)
    return any(net.subnet_of(doc) for doc in DOCUMENTATION_V6)


def check(project: str | None, ssh_source_ranges: tuple[str, ...] | list[str]) -> list[Problem]:
    """Warnings for example values still in a GCP stack: the project id and the SSH source ranges."""
    problems = []
    if project and project.lower() in EXAMPLE_PROJECTS:
        problems.append(
            Problem(
                "gcp:project",
                "is an example project id from the docs, not yours",
                "your project's id: `gcloud projects list` (or the console's project picker)",
                project,
                "warning",
            )
        )
    examples = [r for r in ssh_source_ranges if is_documentation_range(r)]
    if examples:
        problems.append(
            Problem(
                "sshSourceRanges",
                f"{', '.join(examples)} is reserved for documentation "
                "(192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24): no one connects from there, so "
                "SSH to the VM would be refused",
                'your own public address as a /32: "$(curl -s ifconfig.me)/32" (or your network\'s range)',
                list(ssh_source_ranges),
                "warning",
            )
        )
    return problems
