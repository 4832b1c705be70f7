"""`gpu-train push DIR`: data to the host once, not with every run's code.

Data (a gitignored ``data/``, a dataset) is left out of the code sync; ``push`` rsyncs it to the
project's data folder on each node, REMOTE_ROOT/data/PROJECT/, keeping its path in the project
(``data/`` there stays ``data/``): incremental (unchanged files are not sent again), resumable
(--partial), with progress. The job finds it in ``$DATA_DIR``, and at the same path in its working
directory, merged with the code's own folder of that name (a file in both: the code's copy, said in
the run's log).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from invoke import Context, task

from gpu_train.environment import Environment
from gpu_train.errors import GpuTrainError, UsageError
from remote.tasks.session import CLI, STACK_HELP, Session, failures, nodes_failed, on_every_node, say

if TYPE_CHECKING:
    from remote.ssh.target import Target


def data_path(src: Path, root: Path) -> str:
    """Where ``src`` goes under the project's data folder: its path in the project, else its name."""
    try:
        rel = src.relative_to(root)
    except ValueError:
        rel = Path(src.name)
    return rel.as_posix() if rel.parts else src.name


@task(
    help={
        "dir": "the directory to send (e.g. data)",
        "json": "print where it went as JSON",
        "stack": STACK_HELP,
        "to": "`bucket`: to the stack's gpu-train:bucket; each run copies it to $DATA_DIR before its job starts",
    }
)
def push(c: Context, dir: str, stack: str | None = None, json_: bool = False, to: str | None = None) -> None:
    """Send a data directory to the host (every node): incremental, resumable, with progress; the job sees $DATA_DIR."""
    from remote.tasks.localstate import PushedData, local_summary
    from remote.transfer import codesize, sync

    src = Path(dir).expanduser().resolve()
    if not src.is_dir():
        raise UsageError(f"{dir}: no such directory")
    if to not in (None, "host", "bucket"):
        raise UsageError(f"--to {to}: `host` (the default) or `bucket`")
    env = Environment.of(c)
    folder, project = env.project_of(src)  # the project whose job reads it (a monorepo's subfolder)
    rel = data_path(src, folder)
    session = Session(env, stack)
    if to == "bucket":
        push_to_bucket(session.cluster, src, rel, project, env.user_home)
        return
    sessions = session.nodes()
    progress = env.stdout_isatty and len(sessions) == 1 and not json_

    def one(s: Session) -> str:
        from remote.transfer.relay import ChannelRelay

        target = s.target
        dest = f"{target.rsync_root()}/data/{project}/{rel}"
        conn = s.connect()  # verifies (or learns) the host key; rsync goes over this connection
        try:
            with ChannelRelay(conn.transport) as relay:
                sync.push_data(target, target.host, src, dest, progress, rsh=relay.rsh())
        finally:
            s.close()
        return f"{target.remote_root}/data/{project}/{rel}"

    sent = local_summary(src)  # as it was before sending: a file written meanwhile reads as changed at `train`
    say(f"pushing {src} ({codesize.human(sent['bytes'])}) to {len(sessions)} node(s)")
    results = on_every_node(sessions, one)
    if failures(results):
        raise nodes_failed(results, f": run `{CLI} push {dir}` again to resume")
    PushedData(session.target.cache).record(src, [str(s.target.host) for s in sessions], sent, time.time())
    if json_:
        print(
            json.dumps(
                {"source": str(src), "project": project, "path": rel, "hosts": [str(s.target.host) for s in sessions], "remote": results},
                indent=1,
            )
        )
    else:
        print(f"{src} -> {results[0]} on {session.target.host}" + (f" (and {len(sessions) - 1} more nodes)" if len(sessions) > 1 else ""))
        print(
            f"  the job sees it as $DATA_DIR/{rel} and as {rel}/ in its working directory (merged with the code's "
            f"own {rel}/: a file in both is the code's copy)"
        )


def push_to_bucket(target: Target, src: Path, rel: str, project: str, home: Path) -> None:
    """`push --to bucket`: DIR to gs://NAME/PREFIX/.gpu-train-data/PROJECT/REL/, incremental and verified,
    and its manifest into the user's own records (the only data a run copies from the bucket)."""
    from gpu_train.stack.bucket import data_prefix, parse_bucket
    from remote.transfer import bucketfetch, datapush

    if not target.bucket:
        raise UsageError(f"--to bucket: stack {target.stack} has no gpu-train:bucket (docs/bucket.md)")
    place = parse_bucket(target.bucket)
    prefix = data_prefix(place, project)
    got, manifest = datapush.push_folder(bucketfetch.client(), place, prefix, rel, src, datapush.load(home, place, prefix).get(rel))
    datapush.save(home, place, prefix, manifest)
    for problem in got.problems:
        say(problem)
    if got.problems:
        raise GpuTrainError(f"not everything is in the bucket: run `{CLI} push {src} --to bucket` again")
    print(f"{src} -> gs://{place.name}/{prefix}{rel}/: {got.files} file(s), {got.bytes} bytes sent (verified; {got.unchanged} unchanged)")
    print(f"  each run copies exactly these to local disk before its job starts: $DATA_DIR/{rel}, and {rel}/ in its working directory")
