"""`fab train`: sync the code to every node and launch the job there."""

from __future__ import annotations

import json

from invoke import Context, task

from gpu_train.environment import Environment
from remote.tasks.launching import start_run
from remote.tasks.optional import optional_positional
from remote.tasks.runlogs import follow_to_end
from remote.tasks.session import CLI, STACK_HELP, Session
from remote.tasks.shell import say_host_notes
from remote.tasks.trainoptions import TrainOptions


@task(
    iterable=["env", "env_file"],
    positional=["script"],
    help={
        "script": "Python file in --dir to run (`train x.py` or --script x.py), with --args and nothing else (it finds $JOB_DIR)",
        "command": "shell command to run in the synced code instead of --script",
        "dir": "code directory to sync (default: the project, the nearest directory up with stacks/ or .git)",
        "name": "run name; the run id is NAME_YYYYmmdd_HHMMSS (default: the script's name)",
        "args": "arguments for --script, as one quoted string",
        "env": "NAME=VALUE for the job's environment, or NAME to pass this shell's $NAME (a secret stays off command lines); repeatable",
        "env_file": "a file of NAME=VALUE lines for the job's environment (dotenv style: # comments, quotes); repeatable; --env wins",
        "pass_job_dir": "append --job-dir JOB_DIR to the script's arguments (AI Platform's convention)",
        "resume_args": "arguments appended at every relaunch (reboot, preemption, resume), e.g. '--init_from=resume'",
        "resume_if": "add --resume-args only once this file or glob exists in the working directory, e.g. out/ckpt.pt",
        "image": "run in this container image: --script/--command inside it (code, JOB_DIR, DATA_DIR mounted), or alone the "
        "image's own program (no code sent); default: the stack's gpu-train:image; `none`: on the host",
        "entrypoint": "with --image alone: replaces the image's ENTRYPOINT (Vertex AI's command), --args its CMD",
        "pools": "a file naming the worker and ps pools' own jobs (image, entrypoint/args or command, env), as a Vertex AI "
        "job's pools each have theirs; `gpu-train import` writes it; node 0 runs this command's job",
        "launcher": "torchrun (default for a multi-node --script) or none",
        "nproc": "processes per node under torchrun (default: the node's GPUs, or 1)",
        "port": "torchrun's master port on node 0 (default 29500)",
        "ps": "with --command on several nodes: the last N nodes are TF parameter servers (default: the stack's ps pool)",
        "stack": STACK_HELP,
        "timeout": "seconds to wait for SSH (and on GCP for the NVIDIA driver); default 600 on GCP, 15 on SSH stacks",
        "follow": "stream the log until the job ends and exit with its exit code (Ctrl-C detaches; the job goes on)",
        "json": "print the started run as JSON: runId, host, jobDir, dataDir, python, log",
    },
)
def train(
    c: Context,
    script: str | None = None,
    command: str | None = None,
    dir: str | None = None,
    name: str | None = None,
    args: str = "",
    env: str | None = None,
    env_file: str | None = None,
    pass_job_dir: bool = False,
    resume_args: str = "",
    resume_if: str | None = None,
    image: str | None = None,
    entrypoint: str = "",
    pools: str | None = None,
    launcher: str | None = None,
    nproc: str | None = None,
    port: str | None = None,
    ps: str | None = None,
    stack: str | None = None,
    timeout: str | None = None,
    follow: bool = False,
    json_: bool = False,
) -> None:
    """Sync code, install requirements.txt when it changed, launch the job under screen.

    The job sees JOB_DIR (write checkpoints there), RUN_ID and GPU_TRAIN_RESUMES (0, then N on the
    Nth relaunch; --resume-args are added then). It survives the SSH session; follow
    it with the logs task (--follow), bring results home with fetch. On several nodes the code goes
    to all of them at once and each starts its part: torchrun with its --node_rank, or a --command
    with MASTER_ADDR, MASTER_PORT, NODE_RANK, NNODES, NPROC_PER_NODE, WORLD_SIZE and TF_CONFIG.
    """
    environment = Environment.of(c)  # (`env` is --env)
    opts = TrainOptions.read(
        environment,
        script=script,
        command=command,
        dir=dir,
        name=name,
        args=args,
        env=env,
        env_file=env_file,
        pass_job_dir=pass_job_dir,
        resume_args=resume_args,
        resume_if=resume_if,
        image=image,
        entrypoint=entrypoint or "",
        pools=pools,
        launcher=launcher,
        nproc=nproc,
        port=port,
        ps=ps,
        stack=stack,
        timeout=timeout,
        follow=bool(follow),
    )
    started = start_run(environment, opts)
    say_host_notes(started.sessions, started.answers)  # (stderr: busy GPUs, other runs, whether a reboot resumes it)
    cluster, first = started.cluster, started.answers[0]
    if json_:
        print(
            json.dumps(
                {
                    "stack": cluster.stack,
                    "host": str(cluster.host),
                    "nodes": len(started.sessions),
                    **{k: first.get(k) for k in ("runId", "jobDir", "dataDir", "log", "python")},
                },
                indent=1,
            )
        )
    else:
        stack_opt = f" --stack {cluster.stack}"
        several = len(started.sessions) > 1
        nodes = f" on {len(started.sessions)} nodes (node 0: {cluster.host})" if several else f" on {cluster.host}"
        print(f"started {first['runId']}{nodes} ({first['python']}); JOB_DIR={first['jobDir']}")
        if not follow:
            print(f"  follow:  {CLI} logs{stack_opt} --follow" + (" [--node N | --all]" if several else ""))
        print(f"  status:  {CLI} status{stack_opt}")
        print(f"  fetch:   {CLI} fetch{stack_opt} --run {first['runId']}")
    if follow:
        follow_to_end(Session(environment, None, started.timeout, 0, cluster), first["runId"])


optional_positional(train, "script")  # `train x.py` is `train --script x.py`; `train --command CMD` has none
