"""`scalars`: a run's metrics as the job wrote them, read on the host so the answer is one round trip.

Three kinds of file, found anywhere in the run's JOB_DIR (runs/RUN/job) and its working directory
(runs/RUN/code): TensorBoard event files (``tfevents``), one series per tag per folder, the folder's files
in the order they were created; JSONL metrics files (contract.METRICS_FILE), one JSON object a line,
each number in it a tag (nested objects as ``a/b``) at the line's ``step`` (else its line number); and CSV
metrics files (contract.METRICS_CSV, Lightning's CSVLogger's metrics.csv), a header of names, each column
a tag at the row's ``step``, a blank cell no point.

A resumed job writes again from its checkpoint's step: a point whose step is lower than the one before
drops the points at and after its step (what TensorBoard calls purging orphaned data), so a series reads
as the run's single history. The answer is bounded (contract.Scalars).
"""

from __future__ import annotations

import contextlib
import csv
import fnmatch
import itertools
import json
import math
import os
from typing import TYPE_CHECKING, Any, BinaryIO

from gpu_train.contract import METRICS_CSV, METRICS_FILE, SCALAR_POINTS_MAX, SCALAR_SERIES_MAX, Scalars, ScalarSeries

from . import tfevents
from .store import AgentError, find_run, read_json, run_dirs, write_json

if TYPE_CHECKING:
    from typing import TypeGuard  # (Python 3.10; annotations are text on the host's 3.8)

    from .tfevents import Point

# Folders a job's tree holds that are never its metrics: the walk does not go in (nor through links).
SKIP_DIRS = {".git", "__pycache__", ".venv", "venv", "node_modules", "site-packages", ".ipynb_checkpoints"}
WALK_MAX = 200_000  # entries looked at per run: a working directory holding a dataset is not read whole
STEP_KEYS = ("step", "global_step", "iteration", "iter")
NOT_TAGS = set(STEP_KEYS) | {"time", "timestamp", "wall_time", "walltime", "_timestamp", "_runtime", "_step"}
# Bytes of a JSONL or CSV metrics file read per call, its last (a CSV's header too): a bigger file (a dataset
# whose name matched, or every step of a long run) cost seconds of CPU and ~20 times its size in memory on
# the training host at each call (a 16 MB CSV: 3.4 s, 330 MB; its last 8 MiB: 1.7 s, 170 MB), and the dashboard
# asks every few seconds.
TEXT_MAX = 8 << 20
CACHE, CACHE_VERSION = "scalars.json", 2  # runs/RUN/scalars.json: each event file's points and where its reading stopped


def metric_files(run_dir: str, problems: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """(folder -> its event files, oldest first; JSONL and CSV files), as paths relative to the run's folder."""
    events: dict[str, list[str]] = {}
    texts: list[str] = []
    seen = 0
    for top in ("job", "code"):
        for folder, dirs, names in os.walk(os.path.join(run_dir, top)):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            seen += len(dirs) + len(names)
            rel = os.path.relpath(folder, run_dir).replace(os.sep, "/")
            for name in names:
                if name.startswith(tfevents.EVENT_FILE):
                    events.setdefault(rel, []).append(f"{rel}/{name}")
                elif fnmatch.fnmatch(name, METRICS_FILE) or fnmatch.fnmatch(name, METRICS_CSV):
                    texts.append(f"{rel}/{name}")
            if seen > WALK_MAX:
                problems.append(f"{os.path.basename(run_dir)}: more than {WALK_MAX} files; the rest of its tree is not searched")
                return {k: sorted(v, key=_created) for k, v in events.items()}, texts
    return {k: sorted(v, key=_created) for k, v in events.items()}, texts


def _created(path: str) -> tuple[int, str]:
    """An event file's place among its folder's: events.out.tfevents.SECONDS.HOST[.PID.N]."""
    rest = os.path.basename(path)[len(tfevents.EVENT_FILE) :].split(".")
    return (int(rest[0]) if rest and rest[0].isdigit() else 0, path)


def extend(points: list[Point], new: list[Point]) -> None:
    """``new`` after ``points``: a step lower than the last drops what was written at and after it."""
    for p in new:
        if points and p[0] < points[-1][0]:
            while points and points[-1][0] >= p[0]:
                points.pop()
        points.append(p)


def read_jsonl(path: str, problems: list[str]) -> dict[str, list[Point]]:
    """tag -> points of a JSONL metrics file (a last line without its newline is still being written).
    A line that is not a JSON object, or whose step is not a finite number, is skipped and counted: one
    bad line costs only itself."""
    series: dict[str, list[Point]] = {}
    bad = 0
    mtime = os.stat(path).st_mtime
    with open(path, "rb") as f:
        _, before = tail(f, path, problems)
        for number, raw in enumerate(f, before):
            if not raw.endswith(b"\n"):
                break
            if not raw.strip():
                continue
            try:
                line = _line(raw, number, mtime)
            except (ValueError, OverflowError, RecursionError):  # not JSON, a step like NaN, nested too deep
                line = None
            if line is None:
                bad += 1
                continue
            step, wall, values = line
            for tag, value in values:
                extend(series.setdefault(tag, []), [(step, wall, value)])
    if bad:
        problems.append(f"{path}: {bad} line(s) that are not a JSON object with a finite step; skipped")
    return series


def _line(raw: bytes, number: int, mtime: float) -> tuple[int, float, list[tuple[str, float | None]]] | None:
    """(step, wall time, [(tag, value or None when not finite)]) of one line, or None when it is not a
    JSON object. Raises ValueError/OverflowError for a step that is not a finite number."""
    doc = json.loads(raw)
    if not isinstance(doc, dict):
        return None
    step = next((doc[k] for k in STEP_KEYS if _number(doc.get(k))), number)
    if not math.isfinite(step):
        raise ValueError(f"step {step}")
    wall = next((w for w in (_finite(doc.get(k)) for k in ("time", "timestamp", "wall_time")) if w is not None), mtime)
    return int(step), wall, [(tag, _finite(v)) for tag, v in _flat(doc, "")]


def tail(f: BinaryIO, path: str, problems: list[str]) -> tuple[bytes, int]:
    """Where a metrics file ``f`` (at its start) is read from: the whole of one up to TEXT_MAX bytes, (b"", 0);
    else its first line (a CSV's header) and how many lines come before its last TEXT_MAX bytes' first whole
    line, where ``f`` is left (what was cut is said in ``problems``)."""
    size = os.fstat(f.fileno()).st_size
    if size <= TEXT_MAX:
        return b"", 0
    first = f.readline(TEXT_MAX)
    f.seek(size - TEXT_MAX)
    f.readline(TEXT_MAX)  # the rest of a line cut in two
    start = max(f.tell(), len(first))
    f.seek(len(first))
    before, left = 1, start - len(first)
    while left > 0:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            break
        before, left = before + chunk.count(b"\n"), left - len(chunk)
    f.seek(start)
    problems.append(f"{path}: {size / 2**20:.0f} MiB; only its last {TEXT_MAX >> 20} MiB read")
    return first, before


def read_csv(path: str, problems: list[str]) -> dict[str, list[Point]]:
    """tag -> points of a CSV metrics file: its first line the header, then a row a logging step (as
    Lightning's CSVLogger writes them, with a blank cell where a metric was not logged that step). The step
    is the row's ``step`` column (no such column: its row number); a blank cell or one that is not a number
    is no point, NaN or an infinity a gap (null). A last line without its newline is still being written; a
    later line with no number in any cell and no blank cell is a new header (a writer that appended one).
    A row whose step is blank or not finite, longer than its header or holding a NUL byte is skipped and
    counted: one bad row costs only itself."""
    series: dict[str, list[Point]] = {}
    header: list[str] | None = None
    step_key: str | None = None  # the header's step column (its first of STEP_KEYS), found once per header
    bad = row_number = 0
    with open(path, "rb") as f:
        mtime = os.fstat(f.fileno()).st_mtime
        first, before = tail(f, path, problems)
        row_number = max(0, before - 1)  # (the rows before the tail, less the header: a step-less row's number)
        for raw in itertools.chain([first] if first else [], f):
            if not raw.endswith(b"\n"):
                break
            try:
                if b"\0" in raw:  # a file cut and rewritten under the reader (csv refuses NUL before Python 3.11)
                    raise csv.Error("NUL")
                cells = next(csv.reader([raw.decode("utf-8", "replace").rstrip("\r\n")]), [])
            except csv.Error:
                bad += 1
                continue
            if not any(c.strip() for c in cells):
                continue
            values = [_cell(c) for c in cells]
            if header is None or all(v is _TEXT for v in values):
                header = [c.strip() for c in cells]
                step_key = next((k for k in STEP_KEYS if k in header), None)
                continue
            row = _row(header, values, row_number, mtime, step_key)
            row_number += 1
            if row is None:
                bad += 1
                continue
            step, wall, found = row
            for tag, value in found:
                extend(series.setdefault(tag, []), [(step, wall, value)])
    if bad:
        problems.append(f"{path}: {bad} row(s) without a finite step, longer than the header or unreadable; skipped")
    return series


_TEXT, _BLANK = object(), object()  # a CSV cell that is not a number; an empty one


def _cell(text: str) -> object:
    """A CSV cell: a float (NaN and infinities too), _BLANK or _TEXT."""
    text = text.strip()
    if not text:
        return _BLANK
    try:
        return float(text)
    except ValueError:
        return _TEXT


def _row(
    header: list[str], values: list[object], number: int, mtime: float, step_key: str | None
) -> tuple[int, float, list[tuple[str, float | None]]] | None:
    """(step, wall time, [(tag, value or None when not finite)]) of one CSV row under ``header``, whose step
    is in column ``step_key`` (None: the row's ``number``), or None when its step is blank or not finite,
    or it has more cells than the header has names. Its cost is its own cells', whatever the header's
    width (a row of 2 cells under a header of 100,000 names took 5 ms)."""
    if len(values) > len(header):
        return None
    doc = {header[i]: v for i, v in enumerate(values)}  # (a row shorter than its header: the rest blank; Python 3.8: no zip(strict=))
    step = doc.get(step_key) if step_key is not None else float(number)
    if not isinstance(step, float) or not math.isfinite(step):
        return None
    wall = next((w for w in (doc.get(k) for k in ("time", "timestamp", "wall_time")) if isinstance(w, float) and math.isfinite(w)), mtime)
    return (
        int(step),
        wall,
        [(k, v if math.isfinite(v) else None) for k, v in doc.items() if k and k not in NOT_TAGS and isinstance(v, float)],
    )


def _number(v: object) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v: object) -> float | None:
    """A number as a finite float, else None (NaN, an infinity, an int too big for a float, not a number)."""
    if not _number(v):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _flat(doc: dict[str, Any], prefix: str) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for k, v in doc.items():
        if not prefix and k in NOT_TAGS:
            continue
        if isinstance(v, dict):
            out += _flat(v, f"{prefix}{k}/")
        elif _number(v):
            out.append((f"{prefix}{k}", v))
    return out


def wanted(tag: str, source: str, names: list[str]) -> bool:
    """A tag asked for: by its name (a glob), or by its folder's last parts and name (``validation/loss``
    for the tag ``loss`` of logs/validation, as Keras writes them)."""
    if not names:
        return True
    full = f"{source}/{tag}"
    return any(fnmatch.fnmatchcase(tag, n) or (n.endswith("/" + tag) and full.endswith("/" + n)) for n in names)


def thinned(points: list[Point], limit: int) -> list[Point]:
    """At most ``limit`` points, evenly spaced, the first and the last kept."""
    n = len(points)
    if n <= limit:
        return points
    if limit < 2:
        return points[-limit:] if limit else []
    return [points[round(k * (n - 1) / (limit - 1))] for k in range(limit)]


def series_doc(tag: str, source: str, kind: str, points: list[Point], limit: int) -> ScalarSeries:
    finite = [(step, value) for step, _, value in points if value is not None]
    low = min(finite, key=lambda p: p[1]) if finite else None
    high = max(finite, key=lambda p: p[1]) if finite else None
    return {
        "tag": tag,
        "source": source,
        "kind": kind,
        "points": [[p[0], p[2]] for p in thinned(points, limit)],
        "count": len(points),
        "last": [points[-1][0], points[-1][2]],
        "min": [low[0], low[1]] if low else None,
        "max": [high[0], high[1]] if high else None,
        "wallTime": points[-1][1],
    }


def packed(entry: dict[str, Any]) -> dict[str, Any]:
    """A file's reading as the cache keeps it: [step, value] points, and the wall time of each tag's last."""
    series = entry.get("series", {})
    return {
        **{k: v for k, v in entry.items() if k != "series"},
        "points": {t: [[p[0], p[2]] for p in pts] for t, pts in series.items()},
        "walls": {t: pts[-1][1] for t, pts in series.items() if pts},
    }


def unpacked(entry: object) -> dict[str, Any] | None:
    """``packed`` read back (the points' wall times 0 but each tag's last: the only one a series says), or
    None when it is not one."""
    if not isinstance(entry, dict) or not isinstance(entry.get("points"), dict) or not isinstance(entry.get("walls"), dict):
        return None
    try:
        series = {t: [[s, 0.0, v] for s, v in pts] for t, pts in entry["points"].items()}
        for t, pts in series.items():
            if pts:
                pts[-1][1] = float(entry["walls"][t])
    except (TypeError, ValueError, KeyError):
        return None
    return {**{k: v for k, v in entry.items() if k not in ("points", "walls")}, "series": series}


def run_scalars(run_dir: str, tags: list[str], limit: int, problems: list[str]) -> list[ScalarSeries]:
    """The run's series (those ``tags`` name, or all), sorted by source and tag. What the event files held
    is kept in the run's folder (CACHE), so the next call reads only what was written since."""
    changed = False
    events, texts = metric_files(run_dir, problems)
    out: list[ScalarSeries] = []
    cache_path = os.path.join(run_dir, CACHE)
    cache = read_json(cache_path) or {}
    before = cache.get("files") if cache.get("version") == CACHE_VERSION else None
    kept: dict[str, dict[str, Any]] = {}
    for folder, files in sorted(events.items()):
        merged: dict[str, list[Point]] = {}
        for rel in files:
            try:
                st = os.stat(os.path.join(run_dir, rel))
                entry = unpacked((before or {}).get(rel))
                if entry is None or entry.get("ino") != st.st_ino or st.st_size < entry.get("offset", 0):
                    entry = {"ino": st.st_ino}  # a new file, or another one under the name: read from the start
                offset = entry.get("offset")
                read = tfevents.read_scalars(os.path.join(run_dir, rel), problems, entry)
                kept[rel] = entry
                changed = changed or offset != entry.get("offset")
                for tag, points in read.items():
                    if wanted(tag, folder, tags):
                        extend(merged.setdefault(tag, []), points)
            except OSError as e:
                problems.append(f"{rel}: {e.strerror or e}")
        out += [series_doc(t, folder, "tfevents", p, limit) for t, p in sorted(merged.items()) if p]
    if changed or set(kept) != set(before or {}):
        with contextlib.suppress(OSError):  # (a reader that may not write there reads it all the next time too)
            write_json(cache_path, {"version": CACHE_VERSION, "files": {rel: packed(e) for rel, e in kept.items()}})
    for rel in sorted(texts):
        kind = "csv" if fnmatch.fnmatch(os.path.basename(rel), METRICS_CSV) else "jsonl"
        try:
            found = (read_csv if kind == "csv" else read_jsonl)(os.path.join(run_dir, rel), problems)
        except OSError as e:
            problems.append(f"{rel}: {e.strerror or e}")
            continue
        out += [series_doc(t, rel, kind, p, limit) for t, p in sorted(found.items()) if p and wanted(t, rel, tags)]
    return out


def cmd_scalars(root: str, runs: list[str] | None, tags: list[str] | None, points: int) -> dict[str, Any]:
    """`scalars`: the named runs' series (each a run id, a unique prefix or a base name; none: every run)."""
    if not 1 <= points <= SCALAR_POINTS_MAX:
        raise AgentError(f"--points {points}: give 1 to {SCALAR_POINTS_MAX}")
    dirs = [find_run(root, r) for r in runs] if runs else run_dirs(root)
    problems: list[str] = []
    found: list[dict[str, Any]] = []
    total, truncated = 0, False
    for run_dir in dirs:
        series = run_scalars(run_dir, list(tags or []), points, problems)
        if total + len(series) > SCALAR_SERIES_MAX:
            series, truncated = series[: SCALAR_SERIES_MAX - total], True
        total += len(series)
        found.append({"id": os.path.basename(run_dir), "series": series})
    return Scalars(runs=tuple(found), problems=tuple(problems[:100]), points=points, truncated=truncated).to_json()
