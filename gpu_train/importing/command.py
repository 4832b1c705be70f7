"""The ``gpu-train train`` command an imported job becomes: the same module with the same arguments,
its output folder handed to the code as AI Platform (``--job-dir``) or Vertex (``AIP_*_DIR``) did.
Apart from the stack's settings (translate.py): it is the part of an import the user runs."""

from __future__ import annotations

import shlex

from gpu_train.importing.importer import CHANGED, EXACT, NOT_MAPPED, Container, JobDescription, Note

# Vertex's variables for a CustomJob's baseOutputDirectory, with $JOB_DIR in its place.
VERTEX_OUTPUTS = 'AIP_MODEL_DIR="$JOB_DIR/model/" AIP_CHECKPOINT_DIR="$JOB_DIR/checkpoints/" AIP_TENSORBOARD_LOG_DIR="$JOB_DIR/logs/" '


GCS_FUSE = "/gcs/"  # Vertex mounts Cloud Storage there (Cloud Storage FUSE); nothing is mounted there here


def job_env(job: JobDescription) -> dict[str, str]:
    """The job's environment as the platform gave it: the package's env, then the chief container's."""
    chief = job.containers.get("chief")
    return {**job.env, **dict(chief.env if chief else ())}


def train_command(job: JobDescription, stack: str, ps: int, notes: list[Note], env_file: str | None = None) -> list[str]:
    """`gpu-train train` running the job's module (or its container) with its arguments and environment,
    its output folder handed over as the platform did (``ps``: the last nodes that are TF parameter
    servers, 0 for none). With ``env_file`` the environment's values go there (the caller writes it,
    0600), the command names the file: no value is on a command line or in a shell's history."""
    chief = job.containers.get("chief")
    pools_differ(job, notes)
    gcs_paths(job, notes)
    if chief is not None and not chief.package:
        return own_program(job, chief, stack, ps, notes, env_file)
    argv = ["gpu-train", "train", "--stack", stack]
    if chief is not None:
        argv += ["--image", chief.image]
        notes.append(
            Note(
                "pythonPackageSpec.executorImageUri",
                CHANGED,
                f"{chief.image}: the module runs inside that image, from its synced source folder (not installed from packageUris)",
            )
        )
    if job.package_dir:
        parent = job.package_dir.rstrip("/").rpartition("/")[0] or "."
        argv += ["--dir", parent]
    # The output folder as the platform gave it to the code: AI Platform appends --job-dir to the
    # application's arguments; Vertex sets AIP_MODEL_DIR and its siblings (baseOutputDirectory's subfolders).
    flag = bool(job.job_dir) and not job.output_env
    prefix = VERTEX_OUTPUTS if job.job_dir and job.output_env else ""
    if job.python_module:
        text = prefix + shlex.join(["python", "-m", job.python_module, *job.args]) + (' --job-dir "$JOB_DIR"' if flag else "")
        argv += ["--command", text]
        notes.append(Note("pythonModule", EXACT, f"python -m {job.python_module}, from the synced package folder"))
    else:
        argv += (
            ["--command", f"{prefix}python YOUR_SCRIPT.py"]
            if prefix
            else ["--script", "YOUR_SCRIPT.py", *(["--pass-job-dir"] if flag else [])]
        )
        notes.append(Note("pythonModule", NOT_MAPPED, "the job names no Python module: replace YOUR_SCRIPT.py"))
    if job.args:
        notes.append(Note("args", EXACT, shlex.join(job.args)))
    argv += env_flags(job_env(job), env_file, notes)
    if ps:
        argv += ["--ps", str(ps)]
    if job.job_dir:
        copy = (
            (f"; copy results to the bucket with `gcloud storage rsync -r runs/{stack}/RUN {job.job_dir}` after `gpu-train fetch`")
            if job.job_dir.startswith("gs://")
            else ""
        )
        given = "AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR under it" if job.output_env else "--job-dir"
        notes.append(
            Note(
                "baseOutputDirectory" if job.output_env else "jobDir",
                CHANGED,
                f"{job.job_dir} -> $JOB_DIR on the VM (the run's own folder; the code gets {given}, as "
                f"before), fetched home by `gpu-train fetch`{copy}",
            )
        )
    return argv


def env_flags(env: dict[str, str], env_file: str | None, notes: list[Note]) -> list[str]:
    if not env:
        return []
    if env_file:
        notes.append(Note("env", EXACT, f"{', '.join(sorted(env))}: their values in {env_file} (0600), passed to the job by name"))
        return ["--env-file", env_file]
    return [a for key, value in sorted(env.items()) for a in ("--env", f"{key}={value}")]


def own_program(job: JobDescription, chief: Container, stack: str, ps: int, notes: list[Note], env_file: str | None) -> list[str]:
    """A custom container's job: the image's own program, its command replacing ENTRYPOINT and its args CMD."""
    argv = ["gpu-train", "train", "--stack", stack, "--image", chief.image]
    notes.append(Note("containerSpec.imageUri", EXACT, f"{chief.image}: its own program runs, no code is sent (pulled on the VM)"))
    if chief.command:
        argv += ["--entrypoint", shlex.join(chief.command)]
        notes.append(Note("containerSpec.command", EXACT, f"{shlex.join(chief.command)}: replaces the image's ENTRYPOINT"))
    args = list(chief.args) or job.args
    if args:
        argv += ["--args", shlex.join(args)]
        notes.append(Note("containerSpec.args", EXACT, f"{shlex.join(args)}: replace the image's CMD"))
    argv += env_flags(job_env(job), env_file, notes)
    if ps:
        argv += ["--ps", str(ps)]
    if job.job_dir:
        given = "AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR under it" if job.output_env else "$JOB_DIR"
        notes.append(
            Note(
                "baseOutputDirectory" if job.output_env else "jobDir",
                CHANGED,
                f"{job.job_dir} -> $JOB_DIR on the VM (the container gets {given}, mounted at the same path), fetched "
                "home by `gpu-train fetch`",
            )
        )
    return argv


def pools_differ(job: JobDescription, notes: list[Note]) -> None:
    """Every node runs the chief's container: a pool with another image, command or arguments is said."""
    chief = job.containers.get("chief")
    for role, other in sorted(job.containers.items()):
        if role != "chief" and other != chief:
            notes.append(
                Note(
                    f"{role} pool's container",
                    CHANGED,
                    f"{other.image} {shlex.join(other.command + other.args)}".strip()
                    + ": every node runs the chief's container; build one image that branches on CLUSTER_SPEC's task type",
                )
            )


def gcs_paths(job: JobDescription, notes: list[Note]) -> None:
    """Vertex's /gcs/BUCKET/... paths (Cloud Storage FUSE): named, with what to use instead."""
    words = [*job.args, *job.env.values(), *(w for c in job.containers.values() for w in (*c.command, *c.args, *dict(c.env).values()))]
    found = sorted({w for w in words if GCS_FUSE in w})
    if found:
        notes.append(
            Note(
                "/gcs/ paths",
                CHANGED,
                f"{', '.join(found)[:300]}: Cloud Storage is not mounted at /gcs here. Read data from $DATA_DIR "
                "(gpu-train push, or push --to bucket), write outputs to $JOB_DIR (fetched home; gpu-train:bucket copies them to a bucket)",
            )
        )
