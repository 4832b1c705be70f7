"""`gpu-train-agent upload RUN`: the run's outputs to its bucket while the job trains, and once more at its end.

The outputs as `fetch` brings them home: JOB_DIR's files, what the job wrote in its working
directory under ``workdir/``, and the run's log as ``.gpu-train/log``, to ``PREFIX/.gpu-train-runs/STACK/RUN/`` (the
laptop's ``runs/STACK/RUN/``).

Started by the wrapper next to the job, with the job's Python, in a process (and group) of its own;
Google's own client (google-cloud-storage) is imported in ``serve`` only, so the agent's other
modules stay standard library. It honours STORAGE_EMULATOR_HOST from its environment, as the client does.

The rules, each chosen so that nothing half-written is ever taken for a checkpoint:
- *complete*: a file is uploaded once its size and mtime have not changed for SETTLE_S seconds (a
  checkpoint being written keeps changing); after the job's end (stdin closed by the wrapper) every
  file goes, settled or not, since nothing writes any more.
- *atomic*: each file is one upload to its final name; Cloud Storage makes an object visible only when
  its upload completes (a single request, or a resumable session's last chunk), so a process killed
  mid-upload leaves the old object or none, never a partial one. A big file goes in parts sent in
  parallel to the run's parts prefix (never a run's), composed into its object by one request
  (composite.py); a killed uploader's parts are deleted at its next start.
- *verified*: the CRC32C of the bytes read from disk must equal the object's as Cloud Storage reports it,
  and the file's size and mtime must be the same after the upload as before; only then is the file
  recorded in runs/RUN/bucket.json (what `status` and `down` trust). Otherwise it goes again next round.
SIGTERM (the machine going down) does not stop an upload: the last pass runs when the job has ended.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpu_train.bucketdoc import BUCKET_RECORD, UPLOAD_LOG, BucketFile, BucketRecord, BucketView
from gpu_train.checksum import crc32c_of
from gpu_train.codec import answer
from gpu_train.contract import RUN_FILES, RUN_LOG, UNREADABLE, JobSpec
from gpu_train.ownership import project_dirs

from . import composite, outputs
from .store import AgentError, agent_path, now, read_json, read_spec, spec_or_none, write_json

if TYPE_CHECKING:
    from google.cloud.storage import Bucket

    Sig = tuple[int, int]  # (size, mtime_ns)

SETTLE_S = 5.0  # unchanged this long: complete
POLL_S = 2.0
NICE = 10  # the uploader's niceness above the job's
SKIP_PREFIX = ".gpu-train-"  # the wrapper's write probe
WORKDIR = "workdir/"  # the working directory's outputs, as fetch lays them out (runs/STACK/RUN/workdir/)
LOG = f"{RUN_FILES}/{RUN_LOG}"  # the run's log, as fetch lays it out (runs/STACK/RUN/.gpu-train/log)


def scan_dir(top_dir: str, into: str = "", unseen: list[str] | None = None) -> dict[str, Sig]:
    """A folder's regular files (symlinks left out), by path relative to it (after ``into``); what
    cannot be looked at (an unreadable folder or file) goes to ``unseen`` with its reason, never
    silently left out (a guard that trusts this scan would destroy it)."""
    out: dict[str, Sig] = {}

    def seen_not(path: str, e: OSError) -> None:
        if unseen is not None and not isinstance(e, FileNotFoundError):
            rel = os.path.relpath(path, top_dir).replace(os.sep, "/")
            unseen.append(f"{into}{'' if rel == '.' else rel} (unreadable on the host: {e.strerror or e})")

    real_top = os.path.realpath(top_dir)
    for top, dirs, files in os.walk(top_dir, onerror=lambda e: seen_not(e.filename or top_dir, e)):
        for d in [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            dirs.remove(d)
            out_link(os.path.join(top, d), top_dir, real_top, into, unseen)
        for name in files:
            path = os.path.join(top, name)
            if name.startswith(SKIP_PREFIX):
                continue
            if os.path.islink(path):
                out_link(path, top_dir, real_top, into, unseen)
                continue
            try:
                st = os.lstat(path)
            except OSError as e:
                seen_not(path, e)
                continue
            if os.path.isfile(path) and not os.path.islink(path):
                out[into + os.path.relpath(path, top_dir).replace(os.sep, "/")] = (st.st_size, st.st_mtime_ns)
    return out


def out_link(path: str, top_dir: str, real_top: str, into: str, unseen: list[str] | None, also: tuple[str, ...] = ()) -> None:
    """A link whose target exists outside the run (a checkpoint folder linked to a scratch disk): what it
    points to is neither uploaded nor fetched, so it goes to ``unseen`` (only on the host: `down` refuses)
    rather than being silently left out. Its content is never uploaded: a job's link to the host's secrets
    (~/.config/gcloud) must not land in a shared bucket. ``also``: other folders it may lead into."""
    if unseen is None:
        return
    real = os.path.realpath(path)
    if not os.path.exists(real) or any(real == r or real.startswith(r + os.sep) for r in (real_top, *also)):
        return
    rel = os.path.relpath(path, top_dir).replace(os.sep, "/")
    unseen.append(f"{into}{rel} (a link out of the run, to {real}: what it points to is not in the bucket nor fetched)")


def scan(run_dir: str, unseen: list[str] | None = None) -> dict[str, Sig]:
    """The run's outputs as the laptop lays them out: JOB_DIR's files, and what the job wrote in its
    working directory (agent/outputs.py) under ``workdir/``; what the host cannot read goes to
    ``unseen``."""
    root = os.path.dirname(os.path.dirname(run_dir))
    found = scan_dir(os.path.join(run_dir, "job"), unseen=unseen)
    code = os.path.join(run_dir, "code")
    for row in outputs.listing(root, run_dir):
        if row[1] == "f":
            found[f"{WORKDIR}{row[0]}"] = (row[2], row[3])
        elif row[1] == "l":  # (links into the project's pushed data and venvs are not listed as outputs)
            out_link(os.path.join(code, row[0]), code, os.path.realpath(code), WORKDIR, unseen, (os.path.realpath(run_dir),))
        elif row[1] == UNREADABLE and unseen is not None:
            unseen.append(f"{WORKDIR}{row[0]} ({row[5]})")
    with contextlib.suppress(FileNotFoundError):  # the run's log, under the name fetch gives it (contract.RUN_FILES)
        st = os.stat(os.path.join(run_dir, RUN_LOG))
        found[LOG] = (st.st_size, st.st_mtime_ns)
    return found


def local_path(run_dir: str, rel: str) -> str:
    """Where an output's file is on the host: its working directory's for ``workdir/...``, the run's log
    for ``.gpu-train/log``, else JOB_DIR's."""
    if rel == LOG:
        return os.path.join(run_dir, RUN_LOG)
    if rel.startswith(WORKDIR):
        return os.path.join(run_dir, "code", rel[len(WORKDIR) :])
    return os.path.join(run_dir, "job", rel)


def due(current: dict[str, Sig], seen: dict[str, tuple[Sig, float]], done: dict[str, BucketFile], at: float, final: bool) -> list[str]:
    """The files to upload now, updating ``seen`` (each file's signature and since when): those not in
    the bucket as they are, and settled (unchanged SETTLE_S seconds), or any such file once ``final``."""
    for rel in list(seen):
        if rel not in current:
            del seen[rel]
    out = []
    for rel, sig in sorted(current.items()):
        if rel not in seen or seen[rel][0] != sig:
            seen[rel] = (sig, at)
        have = done.get(rel)
        if have is not None and (have["size"], have["mtimeNs"]) == sig:
            continue
        if final or at - seen[rel][1] >= SETTLE_S:
            out.append(rel)
    return out


def only_on_host(run_dir: str, record: BucketRecord | dict[str, Any]) -> list[str]:
    """The run's output files the bucket lacks, or holds in another version, and what the host cannot
    read (it cannot be in the bucket either): for `status` and `down --no-fetch`'s guard."""
    done = record.get("files") or {}
    unseen: list[str] = []
    found = scan(run_dir, unseen)
    return [rel for rel, sig in sorted(found.items()) if rel not in done or (done[rel]["size"], done[rel]["mtimeNs"]) != sig] + unseen


def record_files(run_dir: str) -> dict[str, BucketFile]:
    """What the uploader verified in the bucket (runs/RUN/bucket.json's files): `down --no-fetch` asks the
    bucket itself for each, with its generation, size and CRC32C."""
    return dict((read_json(os.path.join(run_dir, BUCKET_RECORD)) or {}).get("files") or {})


def view(run_dir: str) -> BucketView | None:
    """The run's bucket for `status`, from its record and its JOB_DIR now; None without a bucket."""
    spec = spec_or_none(run_dir)
    where = spec and spec.bucket
    if not where:
        return None
    record = read_json(os.path.join(run_dir, BUCKET_RECORD)) or {}
    files = record.get("files") or {}
    return answer(
        BucketView,
        url=f"gs://{where['name']}/{where['prefix']}",
        files=len(files),
        bytes=sum(f["size"] for f in files.values()),
        onlyHost=only_on_host(run_dir, record),
        final=bool(record.get("final")),
        error=record.get("error"),
    )


def argv(root: str, run_dir: str, spec: JobSpec, command: str) -> list[str]:
    """The agent's ``command`` for this run, run by the job's Python (its venv's, where it has one:
    google-cloud-storage may come from the project's requirements)."""
    venv_python = os.path.join(project_dirs(root, spec.project)[0], "bin", "python")
    python = venv_python if spec.venv and os.access(venv_python, os.X_OK) else spec.python or sys.executable
    agent = agent_path(root)
    if not os.path.isfile(agent):  # as launch does: the copy this agent runs from
        agent = os.path.abspath(sys.argv[0])
    return [python, agent, "--root", root, command, os.path.basename(run_dir)]


def bring_data(root: str, run_dir: str, say: Callable[[str], None]) -> None:
    """Before the job starts: the project's data pushed to the bucket (`push --to bucket`), as the spec's
    manifests name it (datapull.py), copied to $DATA_DIR on local disk, incremental and verified; an
    AgentError (the run fails, saying why) if not."""
    spec = read_spec(run_dir)
    if not spec.bucket_data or not (spec.bucket or {}).get("data"):
        return  # no manifest, no pull: nothing is taken from a listing of the bucket
    with open(os.path.join(run_dir, UPLOAD_LOG), "ab") as log:
        code = subprocess.run(
            argv(root, run_dir, spec, "bucket-data"), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        ).returncode
    if code != 0:
        raise AgentError(f"copying the project's data from the bucket failed (exit {code}; see {UPLOAD_LOG})")
    say("the project's data in the bucket is in $DATA_DIR")


def start(root: str, run_dir: str) -> subprocess.Popen[bytes] | None:
    """The uploader of a run whose spec names a bucket, next to its job, run by the job's Python (its
    venv's, where it has one: google-cloud-storage may come from the project's requirements); its stdin
    is the wrapper's "the job has ended" (closed: the last pass). None without a bucket."""
    spec = spec_or_none(run_dir)
    if not (spec and spec.bucket):
        return None
    with open(os.path.join(run_dir, UPLOAD_LOG), "ab") as log:
        try:
            return subprocess.Popen(
                argv(root, run_dir, spec, "upload"),
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=in_background,
            )
        except OSError as e:  # the job runs on; status shows the error and down --no-fetch refuses
            write_json(os.path.join(run_dir, BUCKET_RECORD), {"error": f"the uploader did not start: {e}", "files": {}})
            return None


def in_background() -> None:
    """In the uploader's process before it runs Python: SIGTERM ignored from its first instruction (an
    ignored signal stays ignored across exec; a machine going down while the uploader still imports
    Google's client, seconds on a busy host, would otherwise kill it before its last pass), and a
    lower CPU priority than the job's (its hashing and parallel parts wait for a core the job leaves)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.nice(NICE)


def finish(proc: subprocess.Popen[bytes] | None, say: Callable[[str], None]) -> None:
    """Tell the uploader the job has ended and wait for its last pass."""
    if proc is None:
        return
    say("uploading the run's last files to the bucket")
    if proc.stdin is not None:
        proc.stdin.close()
    code = proc.wait()
    if code != 0:  # (a success is not written: the log went to the bucket in the last pass, as it is now)
        say(f"the bucket upload ended with exit {code} (see upload.log)")


def put(bucket: Bucket, name: str, path: str, sig: Sig, parts_prefix: str | None = None, rel: str = "") -> BucketFile | None:
    """One file to one object, verified; None when the file changed meanwhile (it goes again later).
    A big one goes in parts sent in parallel and composed into the object (agent/composite.py)
    where the run has a parts prefix."""
    crc = crc32c_of(path)
    pieces = composite.slices(sig[0])
    names = composite.part_names(parts_prefix, rel, len(pieces)) if parts_prefix and len(pieces) > 1 else None
    if names:
        blob = composite.put_parts(bucket, name, path, pieces, names)  # the object appears whole, or not at all
        print(f"[gpu-train upload] {rel}: {len(names)} parts sent in parallel, composed into one object", flush=True)
    else:
        blob = bucket.blob(name)
        blob.upload_from_filename(path, checksum="crc32c")  # one upload: visible only once complete
    st = os.stat(path)
    if (st.st_size, st.st_mtime_ns) != sig or crc32c_of(path) != crc:
        return None
    if blob.crc32c != crc or int(blob.size) != sig[0]:
        raise OSError(
            f"{name}: the bucket's object (crc32c {blob.crc32c}, {blob.size} bytes) is not the file uploaded (crc32c {crc}, {sig[0]} bytes)"
        )
    return {"size": sig[0], "mtimeNs": sig[1], "crc32c": crc, "generation": int(blob.generation)}


def serve(root: str, run_id: str) -> int:
    """Upload until stdin closes (the job ended), then a last pass of everything; 0 when all is verified."""
    run_dir = os.path.join(root, "runs", run_id)
    record_path = os.path.join(run_dir, BUCKET_RECORD)
    where = read_spec(run_dir).bucket or {}
    record: dict[str, Any] = read_json(record_path) or {}  # a BucketRecord
    if record.get("bucket") != where.get("name") or record.get("prefix") != where.get("prefix"):
        record = {"bucket": where["name"], "prefix": where["prefix"], "files": {}}
    record.update(final=False, error=None)

    def save(**changes: object) -> None:
        record.update(changes, at=now())
        write_json(record_path, record)

    save()  # not final: `status` and `down` know an uploader is at work from here on
    try:
        from google.cloud import storage
    except ImportError as e:
        save(error=f"{sys.executable} cannot import google-cloud-storage ({e}): pip install google-cloud-storage")
        print(record["error"], flush=True)
        return 2
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the last pass comes when the job has ended
    ended = threading.Event()

    def wait_for_the_end() -> None:
        sys.stdin.buffer.read()
        ended.set()

    threading.Thread(target=wait_for_the_end, daemon=True).start()
    bucket = storage.Client().bucket(where["name"])
    if where.get("parts"):  # a killed uploader's parts: never an object of the run, and gone now
        with contextlib.suppress(Exception):  # the network: the parts go at a later start
            if gone := composite.forget_parts(bucket, where["parts"]):
                print(f"[gpu-train upload] {gone} part(s) of an unfinished upload deleted", flush=True)
    seen: dict[str, tuple[Sig, float]] = {}
    failures = 0
    while True:
        final = ended.is_set()
        current = scan(run_dir)
        error = None
        for rel in due(current, seen, record["files"], time.monotonic(), final):
            try:
                got = put(bucket, where["prefix"] + rel, local_path(run_dir, rel), current[rel], where.get("parts"), rel)
            except Exception as e:  # the network, a permission: said, and tried again next round
                error = f"{rel}: {e}"
                print(f"[gpu-train upload] {error}", flush=True)
                continue
            if got is not None:
                record["files"][rel] = got
                print(f"[gpu-train upload] {rel}: verified in gs://{where['name']}/{where['prefix']}{rel}", flush=True)
                save()
        save(error=error)
        if final:
            complete = error is None and not only_on_host(run_dir, record)
            if complete or failures >= 3:
                save(final=complete)
                return 0 if complete else 1
            failures += 1
            time.sleep(POLL_S)
        ended.wait(POLL_S)
