"""The agent as one file: a deterministic zipapp, and the bootstrap that ships and installs it.

Laptop side only (not part of the zipapp). The zip has fixed timestamps and modes and sorted
entries, so the same sources give the same bytes (and hash) on every laptop; a host keeps the copy
it was last sent at REMOTE_ROOT/bin/gpu-train-agent and rewrites it only when the bytes differ.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import functools
import gc
import hashlib
import io
import lzma
import re
import shlex
import sys
import threading
import tokenize
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeGuard

from agent.bootstrap import version
from gpu_train.atomic import atomic_write
from gpu_train.contract import CLI_ENV, UNPACKED

PACKAGE = "gpu_train_agent"  # the package's name inside the zipapp
HERE = Path(__file__).resolve().parent
CORE = HERE.parent / "gpu_train"
CONTRACT = CORE / "contract.py"  # the laptop<->host contract, shipped as gpu_train.contract
# The core's modules the agent imports, carried as gpu_train.NAME (standard library only, Python 3.8+): the
# contract and its codec, the recovery's decisions (the booted agent reads its record), the fetch stream's framing,
# a file's CRC32C, the one way a file is replaced (atomic), a sweep's plan, the one way to wait (retry).
CARRIED = (
    "contract.py",
    "answers.py",
    "codec.py",
    "bucketdoc.py",
    "containerspec.py",
    "recovery.py",
    "fetchwire.py",
    "checksum.py",
    "atomic.py",
    "sweeps.py",
    "ownership.py",
    "retry.py",
)
# Data files the agent reads with pkgutil.get_data("gpu_train", NAME), carried as they are: the pinned uv wheels'
# hashes (agent/uvfetch.py; ~1.5 KB).
CARRIED_DATA = ("data/uv-wheels.json",)
# Not in the zipapp: the laptop's builder; the recovery function's Compute layer (infra/recovery.py ships it to
# Cloud Run with gpu_train/recovery.py, no host imports it); serve.py (sent as a script of its own by
# `tensorboard`/`jupyter`). The zipapp travels inline on every call's command line, whose one argument Linux
# caps at 128 KiB.
# guard.py goes: the installed agent checks its root on every run.
LAPTOP_ONLY = {"bundle.py", "bootstrap.py", "recovery_call.py", "serve.py"}
MAIN = f"import sys\nfrom {PACKAGE}.cli import main\nsys.exit(main(sys.argv[1:]))\n"

# BOOTSTRAP (below) runs first on every call: agent/bootstrap.py says how.


_PARSING = threading.Lock()


def parse_python(source: str | bytes, filename: str = "<unknown>", feature_version: tuple[int, int] | None = None) -> ast.Module:
    """``ast.parse``, safe where CPython's AST constructor is not (3.11.0-3.11.7 and 3.12.0-3.12.1, fixed in 3.11.8
    and 3.12.2: python/cpython#106905). It keeps its recursion count in one global of the process, so another parse
    meanwhile fails this one with "SystemError: AST constructor recursion depth mismatch": one by Python code the
    garbage collector runs inside this parse (a finalizer: asyncio's "exception was never retrieved" formats a
    traceback, and 3.11's traceback parses its lines for the carets), or by another thread the GIL passes to then.
    With the collector held, no Python code runs inside the constructor and the GIL stays; the lock keeps two
    callers from turning the collector back on under each other. Every parse of the laptop's and the tests' goes
    through here (tests/unit/test_parse_python.py)."""
    with _PARSING:
        collecting = gc.isenabled()
        gc.disable()
        try:
            return ast.parse(source, filename, feature_version=feature_version)
        finally:
            if collecting:
                gc.enable()


def lean(source: bytes) -> bytes:
    """``source`` without its comments and docstrings, each line where it was (a traceback on the host names
    the line of the checkout): every call carries the agent, and they were a third of the packed bytes."""
    docs = {(n.body[0].lineno, n.body[0].col_offset) for n in ast.walk(parse_python(source)) if _docstring(n)}
    tokens = []
    for t in tokenize.tokenize(io.BytesIO(source).readline):
        if t.type == tokenize.STRING and t.start in docs:  # an empty string over as many lines
            t = t._replace(string=f'"""{chr(10) * t.string.count(chr(10))}"""' if "\n" in t.string else '""')
        if t.type != tokenize.COMMENT:
            tokens.append(t)
    text = tokenize.untokenize(tokens)  # bytes, in the source's encoding (tokenize's first token)
    return re.sub(rb"[ \t]+\n", b"\n", text if isinstance(text, bytes) else text.encode())


def _docstring(node: ast.AST) -> TypeGuard[ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef]:
    """Whether ``node`` is a module, class or function that opens with a docstring (its ``body[0]``)."""
    if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
        return False
    first = node.body[0]
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


CACHE = HERE / "__pycache__"  # where ``cached`` keeps what it made


def cached(name: str, inputs: list[bytes], make: Callable[[], str]) -> str:
    """``make()`` (text), kept beside Python's own compiled modules under a hash of ``inputs``, this module's
    source and the Python version, as Python keeps a .pyc: ``lean`` tokenizes every source, 0.2 s of
    CPU each time a task started. The same inputs give the same text, so a stale or shared copy cannot
    differ; a folder that cannot be written only costs the rebuild."""
    key = hashlib.sha256(repr(sys.version_info[:2]).encode() + Path(__file__).read_bytes())
    for data in inputs:
        key.update(hashlib.sha256(data).digest())
    path = CACHE / f"{name}-{key.hexdigest()[:32]}.txt"
    with contextlib.suppress(OSError):
        return path.read_text(encoding="ascii")
    text = make()
    with contextlib.suppress(OSError):
        atomic_write(path, text, mode=0o644)
    return text


_GUARD_SOURCE = (HERE / "guard.py").read_bytes()
GUARD = cached("guard", [_GUARD_SOURCE], lambda: lean(_GUARD_SOURCE).decode())
_BOOTSTRAP_SOURCE = (HERE / "bootstrap.py").read_bytes()
# bootstrap.py's two imports that cannot run on a host yet, and what the text sent says instead.
INLINED = {
    "from agent.guard import UnsafeRoot, secure_root\n": "\n",  # guard.py's source runs just before it
    "from gpu_train.contract import UNPACKED\n": f"UNPACKED = {UNPACKED!r}\n",
}


def _bootstrap_text() -> str:
    text = lean(_BOOTSTRAP_SOURCE).decode()
    for line, instead in INLINED.items():
        if text.count(line) != 1:
            raise AssertionError(f"agent/bootstrap.py: expected the line {line.strip()!r} once (bundle.INLINED)")
        text = text.replace(line, instead)
    return text


BOOTSTRAP = GUARD + cached("bootstrap", [_BOOTSTRAP_SOURCE, UNPACKED.encode()], _bootstrap_text)


def build(sources: dict[str, bytes], contract: bytes | None = None) -> bytes:
    """A zipapp of ``sources`` (name -> bytes) under PACKAGE and the CARRIED core modules as ``gpu_train.NAME``
    (``contract``: another contract's bytes; the agent imports them as the laptop does), plus its __main__, all
    ``lean``: same input, same bytes."""
    files = {f"{PACKAGE}/{name}": lean(data) for name, data in sources.items()}
    files["gpu_train/__init__.py"] = b""
    for name in CARRIED:
        files[f"gpu_train/{name}"] = lean((CORE / name).read_bytes())
    for name in CARRIED_DATA:
        files[f"gpu_train/{name}"] = (CORE / name).read_bytes()
    if contract is not None:
        files["gpu_train/contract.py"] = lean(contract)
    files["__main__.py"] = MAIN.encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED  # the transport compresses across files
            info.create_system = 3  # unix, wherever the laptop runs
            info.external_attr = 0o644 << 16
            z.writestr(info, files[name])
    return out.getvalue()


@functools.lru_cache(maxsize=1)
def _sources() -> tuple[dict[str, bytes], list[bytes]]:
    """The agent's sources (name -> bytes), and every input of the zipapp (``cached``'s key)."""
    sources = {p.name: p.read_bytes() for p in sorted(HERE.glob("*.py")) if p.name not in LAPTOP_ONLY}
    inputs = [name.encode() + b"\0" + data for name, data in sources.items()]
    inputs += [(CORE / name).read_bytes() for name in CARRIED + CARRIED_DATA]
    return sources, inputs


@functools.lru_cache(maxsize=1)
def packed_payload() -> str:
    """``pack(payload())``, built once per checkout (``cached``)."""
    sources, inputs = _sources()
    return cached("agent", inputs, lambda: pack(build(sources)))


@functools.lru_cache(maxsize=1)
def payload_version() -> str:
    """``version(payload())``, kept once per checkout (``cached``): no call decodes the payload to name it."""
    return cached("agent-version", _sources()[1], lambda: version(payload()))


@functools.lru_cache(maxsize=1)
def payload() -> bytes:
    """This checkout's agent as a zipapp (built once per process, in memory)."""
    return lzma.decompress(base64.b85decode(packed_payload()))


def pack(zipapp: bytes) -> str:
    """The zipapp as it travels on the command line: xz-compressed (across files, unlike the zip's own
    entries; a sixth smaller than deflate, which took the command past 96 KiB of the 128 KiB sshd's
    `sh -c` takes in one argument), base85 (a sixteenth shorter than base64; none of its characters is a
    quote or a backslash, so it stays one word inside the shell's single quotes). The same zipapp gives
    the same text: xz's output depends only on its input and preset."""
    return base64.b85encode(lzma.compress(zipapp, preset=9 | lzma.PRESET_EXTREME)).decode()


def digest(zipapp: bytes) -> str:
    return hashlib.sha256(zipapp).hexdigest()


def agent_command(root: str, *args: str, cli: str, zipapp: bytes | None = None) -> str:
    """A shell command that runs the agent shipped inline (no file needed on the host yet).

    The zipapp travels compressed on the command line: one SSH exec, no stdin, no upload. ``cli``
    is the laptop's command the agent's messages name (the Environment's: ``Target.cli``).
    """
    packed, sent = (packed_payload(), payload_version()) if zipapp is None else (pack(zipapp), version(zipapp))
    # The system Python when there is one: it starts fastest and no environment manager wraps it.
    run = shlex.join(["-I", "-S", "-c", BOOTSTRAP, sent, packed, "--root", root, *args])
    named = shlex.quote(f"{CLI_ENV}={cli}")
    return f'p=/usr/bin/python3; [ -x "$p" ] || p=python3; exec env {named} "$p" {run}'
