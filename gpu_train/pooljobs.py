"""`train --pools FILE`: a cluster whose pools run different jobs, as a Vertex AI CustomJob's worker pools
each have their own ``containerSpec`` (image, command, args, env) or prebuilt image.

The file (``gpu-train import`` writes it, 0600: it holds the pools' env values) names, for the worker and
parameter-server pools, what their nodes run instead of the run's own job (node 0, the chief, runs what
`train`'s flags say)::

    worker:
      image: us-docker.pkg.dev/p/r/worker:3    # required
      entrypoint: [python3, -m, worker]        # the image's own program: ENTRYPOINT and CMD replaced ...
      args: [--shards, "8"]
      env: {SHARDS: "8"}                       # the pool's whole environment, as a Vertex pool's own
    ps:
      image: us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-12.py310:latest
      command: python -m trainer.ps --steps 9  # ... or the project's code inside the image, as --command

Pure: the file read and checked (every problem at once, before anything is sent), then each node's spec
given its pool's job (``apply``). A node's pool is its place in the cluster (contract.node_roles), the
same that TF_CONFIG and CLUSTER_SPEC tell the job.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpu_train.containerspec import ContainerSpec
from gpu_train.contract import JobSpec, node_roles
from gpu_train.jobargs import IMAGE_RE, JobError, parse_env, split_args

POOLS = ("worker", "ps")  # the chief's job is train's flags
KEYS = ("image", "entrypoint", "args", "command", "env")
REGISTRY_ENV = "GPU_TRAIN_REGISTRY_"  # (agent/registry.py's PREFIX) the pull's credentials: every node's, not a pool's


@dataclass(frozen=True)
class PoolJob:
    """One pool's own job: the container it runs and its whole environment."""

    container: ContainerSpec
    command: str | None = None  # the project's code inside the image (else the image's own program)
    env: tuple[tuple[str, str], ...] = ()


def _words(value: Any, where: str) -> tuple[str, ...]:
    """A list of arguments as Vertex writes them, or one string split as a shell would."""
    if value is None:
        return ()
    if isinstance(value, str):
        return split_args(where, value)
    if isinstance(value, list) and all(isinstance(w, (str, int, float)) and not isinstance(w, bool) for w in value):
        return tuple(str(w) for w in value)
    raise JobError(f"{where}: expected a list of strings (or one string)")


def read_pools(doc: Any, name: str) -> dict[str, PoolJob]:
    """The pools' jobs from the file's YAML (``name``: the file, for messages); JobError naming every problem."""
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise JobError(f"--pools {name}: expected a mapping of pools (worker, ps), each with image and its job")
    wrong: list[str] = []
    pools: dict[str, PoolJob] = {}
    for role, job in doc.items():
        where = f"--pools {name}: {role}"
        if role not in POOLS:
            wrong.append(f"{where}: not a pool ({' or '.join(POOLS)}; the chief's job is train's own flags)")
            continue
        try:
            pools[role] = _pool(job, where)
        except JobError as e:
            wrong.append(str(e))
    if wrong:
        raise JobError(wrong[0] if len(wrong) == 1 else "\n".join(wrong))
    return pools


def _pool(job: Any, where: str) -> PoolJob:
    if not isinstance(job, dict):
        raise JobError(f"{where}: expected a mapping with image and entrypoint/args, or image and command")
    if unknown := sorted(set(map(str, job)) - set(KEYS)):
        raise JobError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
    image = job.get("image")
    if not isinstance(image, str) or not IMAGE_RE.fullmatch(image):
        raise JobError(f"{where}.image: {'missing' if image is None else repr(image)[:100]}; write REGISTRY/NAME:TAG or NAME@sha256:DIGEST")
    command = job.get("command")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise JobError(f"{where}.command: expected a shell command (a string)")
    entrypoint, args = _words(job.get("entrypoint"), f"{where}.entrypoint"), _words(job.get("args"), f"{where}.args")
    if command and (entrypoint or args):
        raise JobError(f"{where}: command runs the project's code in the image; entrypoint and args are the image's own program: give one")
    env = job.get("env") or {}
    if not isinstance(env, dict):
        raise JobError(f"{where}.env: expected a mapping NAME: VALUE")
    pairs = [f"{k}={'' if v is None else v}" for k, v in env.items()]
    try:
        parsed = parse_env(pairs)
    except JobError as e:
        raise JobError(f"{where}.env: {e}") from None
    container = ContainerSpec(image=image) if command else ContainerSpec(image=image, own_program=True, entrypoint=entrypoint, args=args)
    return PoolJob(container, command, tuple(sorted(parsed.items())))


def apply(specs: list[JobSpec], pools: dict[str, PoolJob], ps: int) -> list[JobSpec]:
    """Each node's spec with its pool's job, where the file names one (its image, command or entrypoint and
    args, and environment; the run's registry credentials kept: the pull needs them on every node). A pool
    that the cluster lacks is refused: the file was meant for another cluster."""
    if not pools:
        return specs
    if specs[0].launcher == "torchrun":
        raise JobError("--pools runs another job on some nodes, and torchrun needs the same on all: give --launcher none (or --command)")
    roles = node_roles(len(specs), ps)
    if missing := [r for r in pools if r not in roles]:
        have = ", ".join(f"{roles.count(r)} {r}" for r in ("chief", "worker", "ps") if r in roles)
        raise JobError(f"--pools names the {missing[0]} pool, but this cluster has none ({len(specs)} node(s): {have})")
    out = []
    for spec, role in zip(specs, roles, strict=True):
        job = pools.get(role)
        if job is None:
            out.append(spec)
            continue
        pulls = {k: v for k, v in spec.env.items() if k.startswith(REGISTRY_ENV)}
        out.append(
            replace(
                spec,
                pool=role,
                container=job.container,
                command=job.command,
                script=None,
                args=(),
                pass_job_dir=False,
                env={**pulls, **dict(job.env)},
                needs_torch=False,
            )
        )
    return out


def describe(pools: dict[str, PoolJob]) -> list[str]:
    """Each pool's job in a line (names of its variables, never their values)."""
    lines = []
    for role, job in sorted(pools.items()):
        c = job.container
        what = (
            f"--command {job.command!r}"
            if job.command
            else " ".join(
                [*(["entrypoint", " ".join(c.entrypoint)] if c.entrypoint else []), *(["args", " ".join(c.args)] if c.args else [])]
            )
            or "its own ENTRYPOINT and CMD"
        )
        env = f"; env {', '.join(k for k, _ in job.env)}" if job.env else ""
        lines.append(f"{role} nodes: {c.image}, {what}{env}")
    return lines
