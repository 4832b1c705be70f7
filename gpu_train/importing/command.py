"""The ``gpu-train train`` command an imported job becomes: the same module with the same arguments,
its output folder handed to the code as AI Platform (``--job-dir``) or Vertex (``AIP_*_DIR``) did.
Apart from the stack's settings (translate.py): it is the part of an import the user runs."""

from __future__ import annotations

import shlex

from gpu_train.importing.importer import CHANGED, EXACT, NOT_MAPPED, JobDescription, Note

# Vertex's variables for a CustomJob's baseOutputDirectory, with $JOB_DIR in its place.
VERTEX_OUTPUTS = 'AIP_MODEL_DIR="$JOB_DIR/model/" AIP_CHECKPOINT_DIR="$JOB_DIR/checkpoints/" AIP_TENSORBOARD_LOG_DIR="$JOB_DIR/logs/" '


def train_command(job: JobDescription, stack: str, ps: int, notes: list[Note]) -> list[str]:
    """`gpu-train train` running the job's module with its arguments and environment, its output folder
    handed over as the platform did (``ps``: the last nodes that are TF parameter servers, 0 for none)."""
    if job.container:
        notes.append(
            Note(
                "container",
                NOT_MAPPED,
                f"{job.container}: containers are not run (yet). Run the code "
                "that the image holds with --script or --command, with its requirements in requirements.txt",
            )
        )
    argv = ["gpu-train", "train", "--stack", stack]
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
    for key, value in sorted(job.env.items()):
        argv += ["--env", f"{key}={value}"]
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
