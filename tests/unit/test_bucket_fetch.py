"""`fetch --from bucket` by the host fetch's rules, against a real storage emulator: reserved names, local
newer, .previous/, run ids, free space (remote/transfer/bucketfetch.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpu_train.stack.bucket import parse_bucket
from remote.errors import RemoteError
from remote.transfer import bucketfetch
from tests.gcs import Emulator

RUN = "job_20260101_000000"
PLACE = parse_bucket("gs://ckpt/team")


def put(gcs: Emulator, rel: str, data: bytes, run: str = RUN) -> None:
    gcs.client().bucket("ckpt").blob(f"team/.gpu-train-runs/lab/{run}/{rel}").upload_from_string(data)


def test_the_bucket_fetch_keeps_what_the_host_fetch_keeps(tmp_path: Path, gcs: Emulator) -> None:
    """It replaced the laptop's edited files with nothing kept, and wrote any name the bucket held."""
    for rel, data in {
        "a.txt": b"a1",
        "workdir/out/m.pt": b"m",
        ".gpu-train/log": b"log\n",
        "node-1/n.txt": b"n",
        ".previous/a.txt": b"planted",  # names the run's folder here keeps for itself
        ".gpu-train/spec.json": b"{}",
        ".a.txt.gpu-train-partial/x": b"p",
    }.items():
        put(gcs, rel, data)
    dest = tmp_path / "runs" / "lab" / RUN
    got = bucketfetch.fetch_run(gcs.client(), PLACE, "lab", RUN, dest, say=lambda s: None)
    assert got.files == 4 and sorted(p.split(":")[0] for p in got.problems) == [
        ".a.txt.gpu-train-partial/x",
        ".gpu-train/spec.json",
        ".previous/a.txt",
    ]
    files = {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    assert files == {"a.txt": b"a1", "workdir/out/m.pt": b"m", ".gpu-train/log": b"log\n", "node-1/n.txt": b"n"}

    (dest / "a.txt").write_bytes(b"edited here")  # after the upload: the laptop's is newer, kept
    got = bucketfetch.fetch_run(gcs.client(), PLACE, "lab", RUN, dest, say=lambda s: None)
    assert got.kept_newer == ["a.txt"] and got.files == 0 and (dest / "a.txt").read_bytes() == b"edited here"

    os.utime(dest / "a.txt", (time.time() - 3600, time.time() - 3600))  # older than the bucket's: replaced, kept
    put(gcs, "a.txt", b"a2")
    got = bucketfetch.fetch_run(gcs.client(), PLACE, "lab", RUN, dest, say=lambda s: None)
    assert got.files == 1 and (dest / "a.txt").read_bytes() == b"a2"
    assert (dest / ".previous" / "a.txt").read_bytes() == b"edited here"


def test_names_that_are_not_run_ids_are_never_runs(gcs: Emulator) -> None:
    """A decoy name became "the newest", `.` wrote into runs/STACK/, `..` stopped every --all."""
    put(gcs, "a.txt", b"a")
    put(gcs, "a.txt", b"b", run="job_20260102_000000")
    for odd in (".hidden", "notes", "x y_20990101_000000"):
        put(gcs, "a.txt", b"x", run=odd)
    runs, odd = bucketfetch.runs_in(gcs.client(), PLACE, "lab")
    assert runs == [RUN, "job_20260102_000000"] and odd == [".hidden", "notes", "x y_20990101_000000"]
    with pytest.raises(RemoteError, match="is not a run id"):
        bucketfetch.fetch_run(gcs.client(), PLACE, "lab", "..", Path("/nonexistent"), say=lambda s: None)


def test_a_stack_named_like_another_stacks_prefix_sees_none_of_its_runs(gcs: Emulator) -> None:
    """Stack `team` on gs://ckpt beside stack `lab` on gs://ckpt/team: `team`'s area was `team/`, which held
    all of `lab`'s runs (listed here as odd names; its VM's grant covered them). Now the areas are apart."""
    put(gcs, "a.txt", b"a")  # lab's run, on gs://ckpt/team
    assert bucketfetch.runs_in(gcs.client(), parse_bucket("gs://ckpt"), "team") == ([], [])
    assert bucketfetch.runs_in(gcs.client(), PLACE, "lab") == ([RUN], [])


def test_nothing_is_written_when_the_disk_cannot_hold_it(tmp_path: Path, gcs: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    put(gcs, "big.bin", os.urandom(4096))
    dest = tmp_path / "runs" / "lab" / RUN

    class Usage:
        free = 1000

    monkeypatch.setattr(bucketfetch.shutil, "disk_usage", lambda path: Usage)  # the free space the disk reports
    got = bucketfetch.fetch_run(gcs.client(), PLACE, "lab", RUN, dest, say=lambda s: None)
    assert got.files == 0 and "more than this disk has free (1000 bytes): nothing was fetched" in got.problems[0]
    assert not dest.exists() or not any(dest.rglob("*"))


def test_a_download_longer_than_listed_stops_at_its_size(tmp_path: Path) -> None:
    import io

    out = io.BytesIO()
    f = bucketfetch.Bounded(out, 4)
    f.write(b"abcd")
    with pytest.raises(OSError, match="more bytes than the 4"):
        f.write(b"e")
    assert out.getvalue() == b"abcd"


def test_a_gzip_encoded_object_comes_down_as_its_stored_bytes(tmp_path: Path, gcs: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """An object stored gzip-encoded (Content-Encoding: gzip, as Cloud Storage serves it to a client that
    accepts gzip) was inflated by the client as it was written: 10 KiB became 10 MiB on the laptop before
    any size check (a 1 GiB bomb, 1,028x). The emulator does not send that header, so a relay in front of
    it adds it to media downloads, as Cloud Storage does."""
    import gzip
    import http.client
    import threading
    from http.server import BaseHTTPRequestHandler

    from tests.loopback_http import LoopbackServer

    bomb = gzip.compress(bytes(10 << 20))
    blob = gcs.client().bucket("ckpt").blob(f"team/.gpu-train-runs/lab/{RUN}/ckpt.pt")
    blob.content_encoding = "gzip"
    blob.upload_from_string(bomb)
    upstream = gcs.url.rsplit(":", 1)[1]

    class Relay(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", int(upstream), timeout=30)
            conn.request("GET", self.path, headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
            answer = conn.getresponse()
            body = answer.read().replace(f"127.0.0.1:{upstream}".encode(), f"127.0.0.1:{relay.server_address[1]}".encode())  # mediaLink
            self.send_response(answer.status)
            for k, v in answer.getheaders():
                if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                    self.send_header(k, v)
            if "alt=media" in self.path:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            conn.close()

        def log_message(self, *args) -> None:
            pass

    relay = LoopbackServer(("127.0.0.1", 0), Relay)
    threading.Thread(target=relay.serve_forever, args=(0.02,), daemon=True).start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{relay.server_address[1]}")
    try:
        dest = tmp_path / "runs" / "lab" / RUN
        got = bucketfetch.fetch_run(bucketfetch.client(), PLACE, "lab", RUN, dest, say=lambda s: None)
    finally:
        relay.shutdown()
        relay.server_close()
    assert got.problems == [] and got.files == 1
    assert (dest / "ckpt.pt").read_bytes() == bomb  # the stored bytes, verified, never inflated
