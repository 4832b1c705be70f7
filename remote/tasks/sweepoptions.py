"""`sweep`'s flags as one typed object, checked before anything is read or sent.

The task (remote/tasks/sweep.py) reads Invoke's values into a `SweepOptions` once; a bad combination is a
UsageError naming the flag and the fix (`problem`, a pure function a table tests). The trial's own
options (script, command, environment, resume) become a `TrainOptions` only when a sweep starts, so a
sweep's job is checked and built as `train`'s is (launching.job_for).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpu_train import sweeps
from gpu_train.environment import Environment
from gpu_train.errors import UsageError
from remote.tasks import trust
from remote.tasks.trainoptions import TrainOptions

ACTIONS = ("start", "status", "best", "stop")
MODES = ("min", "max")


@dataclass(frozen=True)
class SweepOptions:
    """What `sweep` was asked, checked: each field is one of its flags (help: the task's)."""

    action: str = "start"
    script: str | None = None
    command: str | None = None
    args: str = ""
    file: str | None = None
    values: tuple[str, ...] = ()
    random: tuple[str, ...] = ()
    count: int | None = None
    seed: int | None = None
    gpus_per_trial: int = 1
    slots: int | None = None
    workers: int | None = None
    name: str | None = None
    env: tuple[str, ...] = ()
    resume_args: str = ""
    resume_if: str | None = None
    dry_run: bool = False
    hours_per_trial: float | None = None
    sweep: str | None = None
    metric: str | None = None
    mode: str = "min"
    as_json: bool = False
    stack: str | None = None

    def __post_init__(self) -> None:
        if said := problem(self):
            raise UsageError(said)

    @classmethod
    def read(
        cls,
        *,
        action: str | None = None,
        values: Sequence[str] | None = None,
        random: Sequence[str] | None = None,
        env: Sequence[str] | None = None,
        count: object = None,
        seed: object = None,
        gpus_per_trial: str | int = 1,
        slots: object = None,
        workers: object = None,
        hours_per_trial: object = None,
        args: str | None = "",
        resume_args: str | None = "",
        sweep: str | None = None,
        **rest: Any,
    ) -> SweepOptions:
        """The flags as Invoke gives them (strings, None for unset): each number within its bounds, a
        sweep to stop named as a run id is (never a path)."""
        action = action or "start"
        return cls(
            action=action,
            values=tuple(values or ()),
            random=tuple(random or ()),
            env=tuple(env or ()),
            count=trust.number("--count", count, int, 1),
            seed=trust.number("--seed", seed, int),
            gpus_per_trial=trust.number("--gpus-per-trial", gpus_per_trial, int, 1, 64),
            slots=trust.number("--slots", slots, int, 1, 1024),
            workers=trust.number("--workers", workers, int, 1, 10000),
            hours_per_trial=trust.number("--hours-per-trial", hours_per_trial, float, 0),
            args=args or "",
            resume_args=resume_args or "",
            sweep=(trust.run_option(sweep, "--sweep") or sweep) if action == "stop" else sweep,
            **rest,
        )

    @property
    def inline(self) -> bool:
        """The space given by --values/--random (not a file, not --workers)."""
        return bool(self.values or self.random)

    def base(self) -> str:
        """The sweep's name: --name, else the script's (cut to sweeps.NAME_MAX: its trials' run ids hold it)."""
        from gpu_train import jobs

        return jobs.base_name(self.name, self.script, self.command)[: sweeps.NAME_MAX]

    def job(self, environment: Environment) -> TrainOptions:
        """Every trial's options as `train` takes them (the folder to sync found as `train` finds it):
        the trial's arguments come from the plan, per trial."""
        return TrainOptions.read(
            environment,
            script=self.script,
            command=self.command,
            name=self.name,
            env=list(self.env),
            resume_args=self.resume_args,
            resume_if=self.resume_if,
            stack=self.stack,
        )


def problem(o: SweepOptions) -> str | None:
    """What is wrong with the flags together, said with the fix; None when nothing is."""
    if o.action not in ACTIONS:
        return f"sweep {o.action!r}: use one of {', '.join(ACTIONS)}"
    if o.mode not in MODES:
        return f"--mode {o.mode!r}: min or max"
    if o.action == "stop" and not o.sweep:
        return "sweep stop needs --sweep NAME (`sweep status` names the newest)"
    if o.action == "best" and not o.metric:
        return "sweep best needs --metric NAME (a tag the trials log) and --mode min|max"
    if o.action != "start":
        return None
    if not o.script and not o.command:
        return "give the trial's --script (or --command)"
    if o.workers is not None:
        if o.inline or o.file:
            return "--workers runs your own sweep agent: give no --file, --values or --random with it"
    elif o.file and o.inline:
        return "--file or --values/--random, not both"
    elif not o.file and not o.inline:
        return "say what to sweep: --values NAME=V1,V2 (a grid), --random NAME=MIN:MAX --count N, or --file sweep.yaml"
    return None
