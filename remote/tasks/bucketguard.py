"""`down --no-fetch`: may a stack go without its runs being downloaded? Only when its bucket holds them all.

Pure: judged from each node's `status` document, where the host's uploader says, per run, what is
verified in the bucket (``bucket``: files, onlyHost, final; agent/upload.py).
"""

from __future__ import annotations


def not_in_bucket(docs: list[dict | None]) -> list[str]:
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
