"""The dashboard's page, served live or written as one self-contained file (`gpu-train report`).

One HTML file (assets/index.html), one script (board.js) and one style sheet (board.css), plus uPlot
(assets/uPlot.*, MIT, vendored from npm: no CDN, no build step). Live, the page loads them from the
server and polls its data; the report has all of it inlined, the data too, and a policy that lets it
load nothing from anywhere, so it opens offline and stays as it was written.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

ASSETS = Path(__file__).resolve().parent / "assets"
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
SERVED = ("board.js", "board.css", "uPlot.iife.min.js", "uPlot.min.css")
SCRIPTS, STYLES = ("uPlot.iife.min.js", "board.js"), ("uPlot.min.css", "board.css")
# The report: nothing from the network, nothing from anywhere but the file itself.
REPORT_CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"


def asset(name: str) -> tuple[bytes, str] | None:
    """A served asset's bytes and type; None for any other name."""
    if name not in SERVED:
        return None
    return (ASSETS / name).read_bytes(), TYPES[Path(name).suffix]


def _template(head: str, tail: str) -> str:
    return (ASSETS / "index.html").read_text().replace("<!--HEAD-->", head).replace("<!--TAIL-->", tail)


def live(token: str) -> str:
    """The live page: its assets from the server, the action token for its requests."""
    head = f'<meta name="gpu-train-csrf" content="{html.escape(token)}">\n' + "".join(
        f'<link rel="stylesheet" href="assets/{name}">\n' for name in STYLES
    )
    return _template(head, "".join(f'<script src="assets/{name}"></script>\n' for name in SCRIPTS))


def embedded(doc: object) -> str:
    """JSON that cannot end its <script> element early: '<', '>' and '&' as \\u escapes."""
    return json.dumps(doc).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def report(doc: dict[str, Any]) -> str:
    """The whole page in one file: styles, scripts and ``doc`` (the board, logs and curves) inlined."""
    head = f'<meta http-equiv="Content-Security-Policy" content="{REPORT_CSP}">\n' + "".join(
        f"<style>{(ASSETS / name).read_text()}</style>\n" for name in STYLES
    )
    data = f'<script type="application/json" id="board-data">{embedded(doc)}</script>\n'
    scripts = "".join(f"<script>{_inline(name)}</script>\n" for name in SCRIPTS)
    return _template(head, data + scripts)


def _inline(name: str) -> str:
    """A script's text that cannot end its <script> element early."""
    return (ASSETS / name).read_text().replace("</script", "<\\/script")
