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


def _table() -> tuple[int, ...]:
    rows = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1  # Castagnoli, reflected
        rows.append(c)
    return tuple(rows)


_CRC32C = _table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC32C of ``data`` in pure Python (the host has no ``google_crc32c``): for short records, such as
    a TFRecord's length and a scalar event (tens of bytes), not for whole files."""
    crc ^= 0xFFFFFFFF
    table = _CRC32C
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C (TensorFlow's ``crc32c::Mask``): rotated right by 15 bits plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
