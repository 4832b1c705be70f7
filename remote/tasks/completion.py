"""Shell completion of option values (`gpu-train status --stack <TAB>`, `logs --run <TAB>`), which Invoke's own
`--complete` leaves to file names: the stacks this project finds, and the run ids it has seen (its fetched runs
and the last `status`'s, kept by ``SeenRuns``): no host is asked while the user presses TAB."""

from __future__ import annotations

import json
from pathlib import Path

from gpu_train.atomic import atomic_write
from gpu_train.environment import Environment
from gpu_train.stack import project as projects

STACK_FLAGS, RUN_FLAGS = ("--stack", "-s"), ("--run", "-r")
SEEN = "runs-seen.json"  # in the project's state: STACK -> the run ids its last status listed


class SeenRuns:
    """The run ids the last `status` of each stack listed (this project's), for completion."""

    def __init__(self, state_home: Path):
        self.path = state_home / SEEN

    def read(self) -> dict[str, list[str]]:
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return {k: [str(i) for i in v] for k, v in doc.items() if isinstance(v, list)} if isinstance(doc, dict) else {}

    def write(self, stack: str, ids: list[str]) -> None:
        """Kept when they changed (a `status` that lists the same runs writes and syncs nothing)."""
        seen = self.read()
        if seen.get(stack) != ids[-200:]:
            atomic_write(self.path, json.dumps({**seen, stack: ids[-200:]}, indent=1))


def values(tokens: list[str], env: Environment) -> list[str] | None:
    """Candidates for the value being typed after a --stack or --run in ``tokens`` (the command line so far,
    without the program's name); None when the word is no such value (Invoke completes it)."""
    at = len(tokens) - 1 if tokens and tokens[-1] in (*STACK_FLAGS, *RUN_FLAGS) else len(tokens) - 2
    if at < 0 or tokens[at] not in (*STACK_FLAGS, *RUN_FLAGS):
        return None
    stacks = projects.stack_names(env.stack_dirs)
    if tokens[at] in STACK_FLAGS:
        return stacks
    given = next((tokens[i + 1] for i in range(len(tokens) - 1) if tokens[i] in STACK_FLAGS), None)
    own = projects.stack_names([env.project_root / "stacks"])
    stack, _ = projects.choose_stack(given, env.stack, projects.selected_stack(env.project_root), own)
    if not stack:
        return []
    fetched = env.project_root / "runs" / stack
    ids = set(SeenRuns(env.state_home).read().get(stack, []))
    ids |= {p.name for p in fetched.iterdir() if p.is_dir()} if fetched.is_dir() else set()
    return sorted(ids)
