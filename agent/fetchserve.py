"""`gpu-train-agent fetch-serve`: the host's half of `fab fetch`: list JOB_DIRs, hash blocks, send ranges.

One instance serves one stream (one SSH channel): it reads requests, one JSON line each, on stdin,
and answers on stdout in order, so the laptop can send a whole batch of work in one write and pay
no round trip per file. Every answer is a JSON header line, then ``len`` raw bytes (a file's range,
or a zlib-compressed JSON document), then for ranges a JSON trailer line with the SHA-256 of exactly
the bytes sent and the file's identity (size, mtime, inode) read after sending: the laptop installs
a file only when every range's hash matches and the identity never moved.

Paths are never taken from the wire as they are: a request names a source, a run id (checked against the
run-id syntax: its JOB_DIR), ``ID/workdir`` (its working directory, of which only the outputs are
listed: agent/outputs.py) or ``ID/.gpu-train`` (the run's log, and nothing else of its folder:
the spec and the secrets beside it stay), and a path relative to it (no ``..``, not absolute); the host rebuilds
ROOT/runs/ID/job/PATH (or code/PATH) and refuses to read through a symbolic link (but a working
directory's link to the project's own pushed data, where the job's writes through it land).

Requests:
  {"op": "list", "runs": [ID, ...]}               -> {"runs": {ID: {"entries": [...]} | {"error": ...}}}
  {"op": "hash", "items": [[ID, PATH, OFF, LEN, BLOCK], ...]}
        -> per item: {"sha256": [hex per BLOCK of the range], "whole": hex of the range, "stat": [...]}
  {"op": "read", "items": [[ID, PATH, OFF, LEN], ...]}
        -> per item: header {"len": N}, N bytes, trailer {"sha256": hex, "stat": [size, mtimeNs, ino]}
  {"op": "ping"}                                  -> {} (the laptop times one round trip)
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import zlib
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING, Any

from gpu_train.answers import Hashed, Hashes, Listed, Pong, Refusal, RunListing
from gpu_train.codec import answer
from gpu_train.contract import RUN_FILES, RUN_LOG, UNREADABLE, WORKDIR, is_run_id
from gpu_train.fetchwire import RANGE_HEAD, RANGE_TRAILER

from .outputs import listing as outputs_listing

if TYPE_CHECKING:
    from gpu_train.answers import ListingRow

CHUNK = 256 * 1024


class Refused(Exception):
    pass


def job_dir(root: str, run_id: object) -> str:
    """The folder a source names: ``RUN`` its JOB_DIR, ``RUN/workdir`` its working directory,
    ``RUN/.gpu-train`` the run's own folder (of which only its log is served)."""
    run, sep, tree = run_id.partition("/") if isinstance(run_id, str) else ("", "", "")
    if not is_run_id(run) or (sep and tree not in (WORKDIR, RUN_FILES)):
        raise Refused(f"not a run id: {str(run_id)[:80]!r}")
    return os.path.join(root, "runs", run, *({"": ["job"], WORKDIR: ["code"], RUN_FILES: []}[tree]))


def log_row(run_dir: str) -> list[ListingRow]:
    """The run's log as the fetch's one row for RUN/.gpu-train (none while it does not exist)."""
    try:
        st = os.lstat(os.path.join(run_dir, RUN_LOG))
    except FileNotFoundError:
        return []
    except OSError as e:
        return [(RUN_LOG, UNREADABLE, 0, 0, 0, e.strerror or str(e))]
    if not stat.S_ISREG(st.st_mode):
        return [(RUN_LOG, UNREADABLE, 0, 0, 0, "not a regular file")]
    return [(RUN_LOG, "f", st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode), "")]


def job_path(root: str, run_id: object, rel: object, checked: dict[str, bool] | None = None) -> str:
    """ROOT/runs/ID/job/REL, or Refused for anything that would leave the JOB_DIR.

    ``checked`` remembers folders already resolved inside their JOB_DIR (one realpath per folder,
    not per file: a batch of 60,000 small files has a few hundred folders).
    """
    base = job_dir(root, run_id)
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel:
        raise Refused(f"not a relative path: {str(rel)[:80]!r}")
    if isinstance(run_id, str) and run_id.endswith("/" + RUN_FILES) and rel != RUN_LOG:
        raise Refused(f"{rel[:80]!r}: of the run's own folder, only its {RUN_LOG} is fetched")
    parts = rel.split("/")
    if "" in parts or "." in parts or ".." in parts:
        raise Refused(f"not a plain relative path: {rel[:80]!r}")
    path = base + "/" + rel
    folder = path.rpartition("/")[0]
    known = checked.get(folder) if checked is not None else None
    if known is None:
        parent, real_base = os.path.realpath(folder), os.path.realpath(base)
        known = parent == real_base or parent.startswith(real_base + os.sep)
        if not known and base.endswith(os.sep + "code"):  # an output the job wrote through a link to its pushed data
            known = parent.startswith(os.path.realpath(os.path.join(root, "data")) + os.sep)
        if checked is not None:
            checked[folder] = known
    if not known:
        raise Refused(f"{rel[:80]!r} leads out of the JOB_DIR")
    return path


def why(e: Exception) -> str:
    """An error as the laptop shows it beside the path: the system's words, without the host's full path."""
    return (getattr(e, "strerror", None) or str(e))[:200]


def identity(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def listing(path: str) -> list[ListingRow]:
    """[rel, kind, size, mtimeNs, mode, link target] for everything under ``path`` (never following links).

    kind: f (regular file), d (directory), l (symbolic link). Other kinds (sockets, fifos) are left out.
    What cannot be looked into is a row of kind UNREADABLE with the reason (never silently left out).
    """
    entries: list[ListingRow] = []

    def walk_error(err: OSError) -> None:
        if not isinstance(err, FileNotFoundError):
            entries.append(
                (os.path.relpath(err.filename or path, path).replace(os.sep, "/"), UNREADABLE, 0, 0, 0, err.strerror or str(err))
            )

    for folder, dirs, names in os.walk(path, onerror=walk_error):
        rel_folder = os.path.relpath(folder, path)
        prefix = "" if rel_folder == "." else rel_folder.replace(os.sep, "/") + "/"
        for name in sorted(dirs) + sorted(names):
            full = os.path.join(folder, name)
            try:
                st = os.lstat(full)
            except FileNotFoundError:
                continue  # gone since os.walk listed it
            except OSError as e:
                entries.append((prefix + name, UNREADABLE, 0, 0, 0, e.strerror or str(e)))
                continue
            if stat.S_ISREG(st.st_mode):
                entries.append((prefix + name, "f", st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode), ""))
            elif stat.S_ISDIR(st.st_mode):
                entries.append((prefix + name, "d", 0, st.st_mtime_ns, stat.S_IMODE(st.st_mode), ""))
            elif stat.S_ISLNK(st.st_mode):
                try:
                    target = os.readlink(full)
                except OSError:
                    continue
                entries.append((prefix + name, "l", 0, st.st_mtime_ns, 0o777, target))
    return entries


def list_runs(root: str, run_ids: list[Any]) -> dict[str, RunListing | Refusal]:
    """Each source's listing (Listed's runs): the laptop names them, so each is checked before use."""
    out: dict[str, RunListing | Refusal] = {}
    for run_id in run_ids:
        try:
            path = job_dir(root, run_id)
        except Refused as e:
            out[str(run_id)[:80]] = {"error": str(e)}
            continue
        assert isinstance(run_id, str)  # (job_dir refuses anything else)
        run_dir = os.path.join(root, "runs", run_id.partition("/")[0])
        if not os.path.isdir(run_dir):
            out[run_id] = {"error": f"no run {run_id.partition('/')[0]} on this host"}
            continue
        if run_id.endswith("/" + RUN_FILES):
            out[run_id] = {"entries": log_row(run_dir)}
        elif run_id.endswith("/" + WORKDIR):
            out[run_id] = {"entries": outputs_listing(root, run_dir)}
        else:
            out[run_id] = {"entries": listing(path) if os.path.isdir(path) else []}
    return out


def open_regular(path: str) -> int:
    """Open a regular file, never through a final link, never blocking on a fifo."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Refused("not a regular file")
    return fd


def hash_item(root: str, item: list[Any]) -> Hashed | Refusal:
    """SHA-256 of each BLOCK-sized block of [OFF, OFF+LEN), and of the whole range, in one read."""
    run_id, rel, off, length, block = item
    try:
        fd = open_regular(job_path(root, run_id, rel))
    except (OSError, Refused) as e:
        return {"error": why(e)}
    try:
        whole, blocks = hashlib.sha256(), []
        os.lseek(fd, off, os.SEEK_SET)
        left = length
        while left > 0:
            h = hashlib.sha256()
            want = min(block, left)
            while want > 0:
                data = os.read(fd, min(CHUNK, want))
                if not data:
                    break
                h.update(data)
                whole.update(data)
                want -= len(data)
                left -= len(data)
            blocks.append(h.hexdigest())
            if want > 0:
                break  # the file is shorter than asked: the identity says so
        return {"sha256": blocks, "whole": whole.hexdigest(), "stat": identity(os.fstat(fd))}
    finally:
        os.close(fd)


def send_range(root: str, item: list[Any], out: IO[bytes], checked: dict[str, bool], buf: memoryview) -> None:
    """Header, exactly LEN bytes (zero-padded if the file shrank, which its identity then shows), trailer."""
    run_id, rel, off, length = item
    try:
        fd = open_regular(job_path(root, run_id, rel, checked))
    except (OSError, Refused) as e:
        out.write(json.dumps({"len": 0, "error": why(e)}).encode() + b"\n")
        return
    try:
        out.write(RANGE_HEAD % length)
        h = hashlib.sha256()
        left, pos = length, off
        while left > 0:
            n = os.preadv(fd, [buf[: min(CHUNK, left)]], pos)
            if n <= 0:
                break
            h.update(buf[:n])
            out.write(buf[:n])
            left, pos = left - n, pos + n
        short = left
        while left > 0:
            pad = bytes(min(CHUNK, left))
            h.update(pad)
            out.write(pad)
            left -= len(pad)
        st = os.fstat(fd)
        out.write(
            RANGE_TRAILER % (h.hexdigest().encode(), st.st_size, st.st_mtime_ns, st.st_ino, b', "short": %d' % short if short else b"")
        )
    finally:
        os.close(fd)


def send_doc(doc: Listed | Hashes | Pong | Refusal, out: IO[bytes]) -> None:
    data = zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)
    out.write(json.dumps({"len": len(data), "zlib": True}).encode() + b"\n")
    out.write(data)


def serve(root: str, inp: Iterable[bytes], out: IO[bytes]) -> int:
    """Answer requests until stdin closes."""
    for line in inp:
        try:
            req = json.loads(line)
        except ValueError:
            send_doc(answer(Refusal, error="bad request"), out)
            out.flush()
            return 2
        op = req.get("op")
        if op == "list":
            send_doc(answer(Listed, runs=list_runs(root, list(req.get("runs") or []))), out)
        elif op == "hash":
            send_doc(answer(Hashes, items=[hash_item(root, item) for item in req.get("items", [])]), out)
        elif op == "ping":
            send_doc(answer(Pong), out)
        elif op == "read":
            checked: dict[str, bool] = {}
            buf = memoryview(bytearray(CHUNK))
            for item in req.get("items", []):
                send_range(root, item, out, checked, buf)
        else:
            send_doc(answer(Refusal, error=f"unknown op {op!r}"), out)
        out.flush()
    return 0


def cmd_fetch_serve(root: str) -> int:
    return serve(root, sys.stdin.buffer, sys.stdout.buffer)
