"""The slow tier of `tensorboard --fetched` (tests/unit/test_first_hour.py has the rest): a TensorBoard that
cannot listen takes seconds to say so."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_tensorboard_fetched_never_shows_another_servers_url(tmp_path: Path) -> None:
    """A port found free and then taken (two `tensorboard --fetched` started at once both found 6006 free)
    leaves this TensorBoard unable to listen: the URL there is another's, over another project's runs.
    Only a URL whose TensorBoard says it serves this folder is shown; on a port the user named, a refusal."""
    pytest.importorskip("tensorboard")

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"logdir": "/elsewhere/runs/lab/other"}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        (tmp_path / "runs" / "lab" / "train_20260101_000000").mkdir(parents=True)
        (tmp_path / ".git").mkdir()
        code = "import sys; from remote.cli import main; sys.argv[0] = 'gpu-train'; main()"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GPU_TRAIN_HOME": str(tmp_path / "state")}
        argv = [sys.executable, "-c", code, "tensorboard", "--fetched", "--stack", "lab", "--json", "--local-port", str(port)]
        out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 1 and out.stdout == "", out.stdout + out.stderr
        assert f"TensorBoard could not serve on 127.0.0.1:{port}" in out.stderr
    finally:
        server.shutdown()
