"""A run's log followed for the dashboard: one stream per run however many tabs show it.

The stream is `gpu-train logs --follow`'s own (``remote.tasks.runlogs._stream_log``: the agent's `logs`,
resumed at the right byte after a dropped connection), started when a page first asks for the run's
log; it ends by itself with the run. The text is kept here, its last ``KEEP_BYTES``, with offsets that
count from the first byte kept, so each page asks for what it has not seen yet.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from gpu_train.environment import Environment
from gpu_train.errors import GpuTrainError, outcome

KEEP_BYTES = 2 << 20  # the log's tail a follower keeps (pages show the last part)
KEEP_FOLLOWERS = 32  # ended logs kept (their text) beyond these go, those no page asked for longest first
RETRY_S = 10.0  # a follower that failed (the host did not answer) is tried again no sooner
FIRST_LINES = 2000  # the lines before the follow starts
# The job's colours and the terminal's other escapes: a page shows the text.
ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[@-Z\\-_]|\r(?!\n)")


def plain(text: str) -> str:
    """The log's text without terminal escapes (a carriage return alone, a progress bar's, ends a line)."""
    return ESCAPES.sub(lambda m: "\n" if m.group(0) == "\r" else "", text)


class LogFollower:
    """One run's log, as it grows."""

    def __init__(self, env: Environment, stack: str, run: str):
        self.env, self.stack, self.run = env, stack, run
        self.text = ""
        self.dropped = 0  # characters dropped from the front (KEEP_BYTES)
        self.ended: Mapping[str, Any] | None = None  # the run's last word (state, exit code) once its log ended
        self.error: str | None = None
        self.failed_at = 0.0
        self.asked_at = 0.0
        self.lock = threading.Lock()
        self.grew = threading.Condition(self.lock)
        self.thread = threading.Thread(target=self._follow, name=f"log-{stack}-{run}", daemon=True)

    def start(self) -> LogFollower:
        self.thread.start()
        return self

    @property
    def done(self) -> bool:
        return self.ended is not None or self.error is not None

    def _write(self, data: bytes) -> None:
        with self.lock:
            self.text += plain(data.decode("utf-8", "replace"))
            if len(self.text) > KEEP_BYTES:
                cut = len(self.text) - KEEP_BYTES
                self.text, self.dropped = self.text[cut:], self.dropped + cut
            self.grew.notify_all()

    def _follow(self) -> None:
        from remote.tasks.runlogs import _stream_log
        from remote.tasks.session import Session

        session = None
        try:
            session = Session(self.env, self.stack)
            self.ended = _stream_log(session, self.run, FIRST_LINES, True, self._write, lambda: None) or {}
        except GpuTrainError as e:
            self.error, self.failed_at = outcome(e)[1], time.monotonic()
        except Exception as e:  # a follower's failure is its page's message, never the server's
            self.error, self.failed_at = f"{type(e).__name__}: {e}", time.monotonic()
        finally:
            if session is not None:
                session.close()
            with self.lock:
                self.grew.notify_all()

    def since(self, offset: int, wait_s: float = 0.0) -> dict[str, Any]:
        """The text from ``offset`` on (counted from the log's first byte seen), waiting up to ``wait_s`` for more."""
        with self.lock:
            if wait_s and self.dropped + len(self.text) <= offset and not self.done:
                self.grew.wait(wait_s)
            start = max(offset, self.dropped)
            return {
                "from": start,
                "text": self.text[start - self.dropped :],
                "next": self.dropped + len(self.text),
                "ended": self.ended,
                "error": self.error,
            }


class Logs:
    """The followers, one per run asked for; a finished one is kept (its text stays, up to KEEP_FOLLOWERS),
    a failed one tried again when a page asks after RETRY_S. A follower ends with its run (or the dashboard)."""

    def __init__(self, env: Environment):
        self.env = env
        self.followers: dict[tuple[str, str], LogFollower] = {}
        self.lock = threading.Lock()

    def of(self, stack: str, run: str) -> LogFollower:
        with self.lock:
            f = self.followers.get((stack, run))
            if f is None or (f.error is not None and time.monotonic() - f.failed_at > RETRY_S):
                f = self.followers[(stack, run)] = LogFollower(self.env, stack, run).start()
            f.asked_at = time.monotonic()
            ended = sorted((x.asked_at, key) for key, x in self.followers.items() if x.done)
            for _, key in ended[: max(0, len(self.followers) - KEEP_FOLLOWERS)]:  # the logs no page asked for longest
                del self.followers[key]
            return f
