"""A package index on loopback (PEP 503's simple pages, http.server in a thread): what a test host's
pip and uv download from, with no traffic beyond this machine.

It serves real wheels: uv's own from PyPI (the pinned one, gpu_train/data/uv-wheels.json: a host takes
no other), and small pure-Python ones a test makes.
"""

from __future__ import annotations

import base64
import hashlib
import html
import http.server
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

from agent.uvfetch import PINS, UV_VERSION
from remote.loopback import free_port
from tests.loopback_http import LoopbackServer

# An index nothing listens on: a host whose sessions have it set reaches no index at all (pip and the
# uv fetch fail at once), as a host without internet; tests that do not exercise installs use it.
OFFLINE_INDEX = "http://127.0.0.1:9/simple"


def make_wheel(folder: Path, name: str, version: str, modules: dict[str, str]) -> Path:
    """A pure-Python wheel of ``modules`` (file name -> source), installable by pip and uv."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {
        **{m: s.encode() for m, s in modules.items()},
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: gpu-train-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = (
        "".join(
            f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n" for p, d in files.items()
        )
        + f"{dist}.dist-info/RECORD,,\n"
    )
    files[f"{dist}.dist-info/RECORD"] = record.encode()
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in files.items():
            z.writestr(p, d)
    return path


UV_WHEEL = f"uv-{UV_VERSION}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
# Where PyPI's wheel is kept once downloaded (beside the venv, git-ignored; pip's cache holds it too).
WHEELS = Path(__file__).resolve().parents[1] / ".venv" / "wheels"


def uv_wheel(folder: Path) -> Path:
    """PyPI's uv wheel for this machine (x86_64, glibc), the pinned one, copied into ``folder``. Downloaded
    once with pip (from pip's cache when the venv's install fetched it), checked against the table."""
    kept = WHEELS / UV_WHEEL
    if not kept.is_file():  # into a folder of its own, then renamed: xdist's workers may do it at once
        part = WHEELS / f"part-{os.getpid()}"
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--platform"]
        subprocess.run([*pip, "manylinux_2_17_x86_64", f"uv=={UV_VERSION}", "-d", str(part)], check=False, capture_output=True)
        if (part / UV_WHEEL).is_file():
            os.replace(part / UV_WHEEL, kept)
        shutil.rmtree(part, ignore_errors=True)
    if not kept.is_file() or hashlib.sha256(kept.read_bytes()).hexdigest() != PINS["wheels"][UV_WHEEL]:
        raise RuntimeError(f"{kept}: PyPI's {UV_WHEEL} could not be had (pip download) or is not the pinned one")
    return Path(shutil.copy(kept, folder / UV_WHEEL))


def rebuilt_wheel(folder: Path, name: str, binary: Path) -> Path:
    """A wheel named ``name`` holding ``binary`` where uv's wheel has its binary: a substitute."""
    path = folder / name
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.write(binary, f"uv-{UV_VERSION}.data/scripts/uv")
        z.writestr(f"uv-{UV_VERSION}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: uv\nVersion: {UV_VERSION}\n")
    return path


class PackageIndex:
    """Serves /simple/PROJECT/ and /files/NAME for the wheels given; counts the files sent."""

    def __init__(self, address: str, wheels: list[Path]):
        self.files = {w.name: w for w in wheels}
        self.sent: list[str] = []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                self.answer(head=True)

            def do_GET(self) -> None:
                self.answer(head=False)

            def answer(self, head: bool) -> None:
                body = index.page(self.path, count=not head)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/html" if self.path.startswith("/simple") else "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                # As PyPI answers: a file never changes; a project's page may, after ten minutes.
                files = self.path.startswith("/files/")
                self.send_header("Cache-Control", "max-age=365000000, immutable, public" if files else "max-age=600, public")
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = LoopbackServer((address, free_port(address)), Handler)
        self.url = f"http://{address}:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()  # shutdown() waits one poll

    def page(self, path: str, count: bool = True) -> bytes | None:
        parts = [p for p in path.split("?")[0].split("/") if p]
        if parts[:1] == ["files"] and len(parts) == 2 and parts[1] in self.files:
            if count:
                self.sent.append(parts[1])
            return self.files[parts[1]].read_bytes()
        if parts[:1] == ["simple"] and len(parts) == 2:
            project = parts[1].lower().replace("_", "-")
            links = [
                f'<a href="../../files/{html.escape(n)}#sha256={hashlib.sha256(p.read_bytes()).hexdigest()}">{html.escape(n)}</a>'
                for n, p in sorted(self.files.items())
                if n.split("-")[0].lower().replace("_", "-") == project
            ]
            if links:
                return ("<!DOCTYPE html><html><body>" + "<br>".join(links) + "</body></html>").encode()
        return None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
