"""gcp-storage-emulator serving its connections concurrently, as Cloud Storage does: for benchmarks.

The emulator's HTTP server handles one request at a time; through a long link it reads one
upload's body at the link's speed while every other connection waits, so parts sent in parallel
would be measured one after the other. Here it runs with a threaded server, its storage calls
taken one at a time under a lock (its in-memory store is not made for threads). The tests run the
emulator as it ships (tests/gcs.py). Arguments as ``gcp-storage-emulator``'s.
"""

from __future__ import annotations

import functools
import http.server
import inspect
import sys
import threading
from collections.abc import Callable
from typing import Any

from gcp_storage_emulator import storage
from gcp_storage_emulator.__main__ import main

_LOCK = threading.RLock()


def _serialised(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return fn(*args, **kwargs)

    return call


for _name, _fn in list(vars(storage.Storage).items()):
    if inspect.isfunction(_fn) and not _name.startswith("__"):
        setattr(storage.Storage, _name, _serialised(_fn))
http.server.HTTPServer = http.server.ThreadingHTTPServer  # type: ignore[misc]  # what the emulator's APIThread starts

if __name__ == "__main__":
    sys.exit(main())
