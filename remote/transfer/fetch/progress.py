"""One progress bar for a whole fetch (bytes, rate, ETA) on a terminal; a one-line summary otherwise."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from remote.transfer.codesize import human


def bar_line(done: int, total: int, elapsed: float, width: int = 24) -> str:
    """`[#####-----]  40%  410.0 MiB / 1.0 GiB  52.3 MiB/s  ETA 12 s` (pure, for tests and the bar)."""
    frac = min(1.0, done / total) if total else 1.0
    rate = done / elapsed if elapsed > 0 else 0.0
    eta = f"ETA {(total - done) / rate:.0f} s" if rate > 0 and done < total else "ETA -"
    filled = int(frac * width)
    return f"[{'#' * filled}{'-' * (width - filled)}] {frac * 100:3.0f}%  {human(done)} / {human(total)}  {human(rate)}/s  {eta}"


class Progress:
    """Counts received bytes (from several threads); draws the bar on a terminal a few times a second."""

    def __init__(self, total: int = 0, live: bool | None = None, out: TextIO = sys.stderr):
        self.total, self.done_bytes, self.out = total, 0, out
        self.live = out.isatty() if live is None else live
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, total: int) -> None:
        self.total, self.started = total, time.monotonic()
        if self.live and total and self._thread is None:
            self._thread = threading.Thread(target=self._draw, daemon=True)
            self._thread.start()

    def add(self, n: int) -> None:
        with self._lock:
            self.done_bytes += n

    def _draw(self) -> None:
        while not self._stop.wait(0.2):
            self.out.write("\r" + bar_line(self.done_bytes, self.total, time.monotonic() - self.started) + "\x1b[K")
            self.out.flush()

    def done(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.out.write("\r" + bar_line(self.done_bytes, self.total, time.monotonic() - self.started) + "\x1b[K\n")
            self.out.flush()
            self._thread = None

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started
