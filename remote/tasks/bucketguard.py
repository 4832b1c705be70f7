"""`down --no-fetch`: may a stack go without its runs being downloaded? Only when its bucket holds them all.

Pure: judged from each node's `status` document, where the host's uploader says, per run, what is
verified in the bucket (``bucket``: files, onlyHost, final; agent/upload.py).
"""

from __future__ import annotations

from typing import Any


def not_in_bucket(docs: list[dict[str, Any] | None]) -> list[str]:
    """What the bucket does not hold, one line each: a run without a bucket (started before it was set),
    a run whose last upload has not finished, a file only on the host. Empty: the bucket has everything."""
    lines = []
    for node, doc in enumerate(docs):
        where = f"node {node}: " if len(docs) > 1 else ""
        if doc is None:
            lines.append(f"node {node}: could not be asked")
            continue
        for run in doc.get("runs", []):
            b = run.get("bucket")
            if not b:
                lines.append(f"{where}{run['id']}: not in the bucket (it started before gpu-train:bucket was set)")
            elif b.get("onlyHost"):
                only = b["onlyHost"]
                lines.append(
                    f"{where}{run['id']}: only on the host: {', '.join(only[:5])}" + (f" and {len(only) - 5} more" if len(only) > 5 else "")
                )
            elif not b.get("final"):
                lines.append(f"{where}{run['id']}: its last upload has not finished" + (f" ({b['error']})" if b.get("error") else ""))
    return lines


def differs_in_bucket(expected: dict[str, dict[str, Any]], listed: dict[str, tuple[int, int, str]], run: str, limit: int = 5) -> list[str]:
    """What the bucket itself lacks of a run's record: ``expected`` (object name -> the host's record:
    generation, size, crc32c) against ``listed`` (object name -> (generation, size, crc32c), as the laptop
    listed the bucket). One line per run naming what differs: gone (deleted by a VM with the grant, a
    lifecycle rule, a person) or another version (overwritten since it was verified)."""
    gone, other = [], []
    for name, rec in sorted(expected.items()):
        have = listed.get(name)
        if have is None:
            gone.append(name)
        elif have != (int(rec["generation"]), int(rec["size"]), str(rec["crc32c"])):
            other.append(f"{name} (generation {have[0]}, {have[1]} bytes; verified was {rec['generation']}, {rec['size']} bytes)")
    lines = []
    for what, names in (("not in the bucket", gone), ("another version in the bucket", other)):
        if names:
            more = f" and {len(names) - limit} more" if len(names) > limit else ""
            lines.append(f"{run}: {what}: {', '.join(names[:limit])}{more}")
    return lines


def expected_objects(record: dict[str, dict[str, Any]], run_prefix: str) -> dict[str, dict[str, Any]]:
    """The host's record (path in the run -> generation, size, crc32c) as object names under the prefix the
    laptop computes itself from its stack (never the host's word for where the run is)."""
    return {run_prefix + rel: rec for rel, rec in record.items()}


def recorded_prefix(candidates: list[str], bucket: str, url: object) -> str | None:
    """Which of the run prefixes the laptop computes for a run from its own stack (its area's, then its
    name's folder from before areas) the host's uploader wrote to, by the run's bucket ``url`` in `status`
    (``gs://NAME/PREFIX``); None when it is none of them (the host's word names no folder of this stack's)."""
    return next((p for p in candidates if url == f"gs://{bucket}/{p}"), None)
