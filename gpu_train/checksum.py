"""A file's CRC32C as Cloud Storage reports an object's (base64 of the big-endian digest): what the host's
upload (agent/upload.py) and the laptop's bucket fetch (remote/transfer/bucketfetch.py) compare
with the bucket's. The agent's zipapp carries it; ``google_crc32c`` (google-cloud-storage's own
dependency, with its C implementation) is imported only when a checksum is taken, by those two.
"""

from __future__ import annotations

import base64

BLOCK = 1 << 20


def crc32c_of(path: str) -> str:
    import google_crc32c

    c = google_crc32c.Checksum()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            c.update(block)
    return base64.b64encode(c.digest()).decode()
