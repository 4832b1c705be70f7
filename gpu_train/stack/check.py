"""A stack's settings parsed and checked by the rules of its target, every problem at once.

An SSH stack has rules of its own (its lifecycle settings here, its values in ``values``); a GCP stack
has those and Compute Engine's (gpu_train/gcp/validate.py, against the catalog). The tasks check an SSH
stack with ``check_ssh`` (remote/ssh/target.py), so they never import Compute Engine's rules nor read
the catalog for one: that cost every command on a plain SSH host CPU for nothing
(tests/e2e/test_ssh_imports.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpu_train.stack import values
from gpu_train.stack.config import SECRET_VALUE, _normalise_keys, parse_partial
from gpu_train.stack.problems import ConfigError, Problem
from gpu_train.stack.settings import NAMESPACE, StackConfig

if TYPE_CHECKING:
    from gpu_train.catalog.model import Catalog


def target_of(raw: dict[str, Any]) -> str:
    """The target a stack's raw settings name: 'gcp' when none (a wrong one is the parse's to report)."""
    return "ssh" if _normalise_keys(raw).get(f"{NAMESPACE}:target") == "ssh" else "gcp"


def check_ssh(raw: dict[str, Any], stack: str) -> tuple[StackConfig, list[Problem]]:
    """An SSH stack's config and its warnings, or ConfigError with every problem (a GCP stack's are
    gpu_train/gcp/validate.py ``check``'s, against the catalog)."""
    return checked(raw, stack, None, ssh_rules)


def checked(
    raw: dict[str, Any], stack: str, catalog: Catalog | None, rules: Callable[[StackConfig], list[Problem]]
) -> tuple[StackConfig, list[Problem]]:
    """Parse, then the ``rules`` on what parsed (a setting that failed to parse is left out of them: its own
    problem says why); the config and its warnings, or ConfigError with every error."""
    cfg, problems = parse_partial(raw, stack, catalog)
    bad = {p.key for p in problems}
    problems += [p for p in rules(cfg) if p.key not in bad]
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise ConfigError(errors, stack)
    return cfg, problems


def ssh_rules(cfg: StackConfig) -> list[Problem]:
    """The rules every stack meets, and all an SSH stack has."""
    return lifecycle(cfg) + values.check(cfg)


def lifecycle(cfg: StackConfig) -> list[Problem]:
    """Idle stop, resumes and the webhook: every target's (recoverHours, GCP's alone, is validate's)."""
    problems = []
    if cfg.idle_stop_minutes < 0:
        problems.append(Problem("idleStopMinutes", "must be 0 (off) or more", "e.g. 30", cfg.idle_stop_minutes))
    if cfg.max_resumes < 0:
        problems.append(Problem("maxResumes", "must be 0 (never resume) or more", "e.g. 10", cfg.max_resumes))
    if cfg.notify not in (None, SECRET_VALUE) and not re.fullmatch(r"https?://[^\s/]+\S*", cfg.notify):
        problems.append(
            Problem(
                "notify",
                "is not a webhook URL (https://...)",
                "pulumi config set --secret gpu-train:notify https://ntfy.sh/YOUR-TOPIC (or a Slack or Discord webhook)",
                "(hidden)",
            )
        )
    return problems
