"""What `train` says of a folder its code sync leaves out that `push` sent: to the stack's hosts
(localstate.PushedData, recorded by `push`) or to its bucket (datapush's manifests, which runs copy):
sent and unchanged since, or changed (and how), instead of "To send data/: gpu-train push data".
ignores.left_out_summary puts it in words.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from remote.tasks.localstate import PushedData, local_summary
from remote.transfer.ignores import LeftOut, Pushed, folder_of, summary_change

if TYPE_CHECKING:
    from gpu_train.environment import Environment
    from remote.ssh.target import Target


def pushed_folders(environment: Environment, cluster: Target, code_dir: Path, items: Sequence[LeftOut]) -> dict[str, Pushed]:
    """The folders left out (by folder_of) that `push` sent to every one of ``cluster``'s hosts, or to its
    bucket; a folder sized only in part (over 50,000 entries) is not looked at for changes."""
    capped = {folder_of(i) for i in items if i.capped}
    folders = {f for f in map(folder_of, items) if f and f not in ("runs", ".gpu-train")}
    records = PushedData(cluster.cache)
    hosts = [str(h) for h in cluster.hosts]
    out: dict[str, Pushed] = {}
    for folder in sorted(folders):
        src = code_dir / folder
        record = records.get(src)
        if record is not None and set(hosts) <= set(record["hosts"]):
            more = f" and {len(hosts) - 1} more" if len(hosts) > 1 else ""
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(record["at"])) if isinstance(record.get("at"), float) else "?"
            change = None if folder in capped else summary_change(record, local_summary(src))
            out[folder] = Pushed(f"to {hosts[0]}{more} at {when}", change)
        elif cluster.bucket and (in_bucket := bucket_pushed(environment, cluster.bucket, src, folder in capped)) is not None:
            out[folder] = in_bucket
    return out


def bucket_pushed(environment: Environment, bucket: str, src: Path, capped: bool) -> Pushed | None:
    """``src`` as `push --to bucket` sent it (its manifest, which each run copies), by names and sizes; None
    when no manifest names it."""
    from gpu_train.stack.bucket import data_prefix, parse_bucket
    from remote.tasks.data import data_path
    from remote.transfer import datapush

    folder, project = environment.project_of(src)
    place = parse_bucket(bucket)
    prefix = data_prefix(place, project)
    rel = data_path(src.resolve(), folder)
    manifest = datapush.load(environment.user_home, place, prefix).get(rel)
    if manifest is None:
        return None
    to = f"to gs://{place.name}/{prefix}{rel}/"
    if capped:
        return Pushed(to, None)
    sent = {name: f["size"] for name, f in manifest["files"].items()}
    here = sizes(src)
    differ = len(set(sent) ^ set(here)) + sum(1 for name in set(sent) & set(here) if sent[name] != here[name])
    return Pushed(to, f"{differ} file(s) differ by name or size" if differ else "")


def sizes(src: Path) -> dict[str, int]:
    """Each regular file under ``src`` (links not followed, as `push` sends them): its path there -> bytes."""
    out = {}
    for folder, _, names in os.walk(src):
        for name in names:
            path = Path(folder, name)
            if path.is_file() and not path.is_symlink():
                out[path.relative_to(src).as_posix()] = path.stat().st_size
    return out
