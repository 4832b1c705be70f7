"""The fetch stream's framing of a range, byte for byte: the host's sender (agent/fetchserve.py)
writes it, the laptop's stream (remote/transfer/fetch/stream.py) reads it. Standard library only,
Python 3.8+: the agent's zipapp carries it.

A range is a header line, exactly ``len`` bytes, then a trailer line with the SHA-256 of the bytes
sent and the file's identity read after sending. The laptop matches these patterns rather than
parsing JSON (a JSON parser per file was a tenth of its time for small files); anything else it gets
(an error header, a trailer with "short") it parses as the JSON it also is.
"""

from __future__ import annotations

import re

RANGE_HEAD = b'{"len": %d}\n'
RANGE_TRAILER = b'{"sha256": "%s", "stat": [%d, %d, %d]%s}\n'  # the last: b', "short": N' or b""
RANGE_HEAD_RE = re.compile(rb'\{"len": (\d{1,20})\}\n')  # no number int() would refuse: those go to JSON
RANGE_TRAILER_RE = re.compile(rb'\{"sha256": "([0-9a-f]{64})", "stat": \[(\d{1,20}), (\d{1,20}), (\d{1,20})\]\}\n')
