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
import hashlib
import io
import re
import shlex
import sys
import tokenize
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

from gpu_train.atomic import atomic_write
from gpu_train.contract import CLI_ENV, UNPACKED

PACKAGE = "gpu_train_agent"  # the package's name inside the zipapp
HERE = Path(__file__).resolve().parent
CORE = HERE.parent / "gpu_train"
CONTRACT = CORE / "contract.py"  # the laptop<->host contract, shipped as gpu_train.contract
# The core's modules the agent imports, carried as gpu_train.NAME (standard library only, Python 3.8+): the
# contract and its codec, the recovery's decisions (the booted agent reads its record), the fetch stream's framing,
# a file's CRC32C.
CARRIED = ("contract.py", "codec.py", "containerspec.py", "recovery.py", "fetchwire.py", "checksum.py")
# Not in the zipapp: the laptop's builder; the recovery function's Compute layer (infra/recovery.py ships it to
# Cloud Run with gpu_train/recovery.py, no host imports it); serve.py (sent as a script of its own by
# `tensorboard`/`jupyter`). The zipapp travels inline on every call's command line, whose one argument Linux
# caps at 128 KiB.
# guard.py goes: the installed agent checks its root on every run.
LAPTOP_ONLY = {"bundle.py", "recovery_call.py", "serve.py"}
MAIN = f"import sys\nfrom {PACKAGE}.cli import main\nsys.exit(main(sys.argv[1:]))\n"

# Runs under `python3 -I -S -c BOOTSTRAP PACKED --root ROOT SUBCOMMAND ...` (PACKED: ``pack``; -I: nothing
# from the login folder or PYTHON* variables is imported): first checks that ROOT is the login user's
# alone (guard.py, inline: nothing is written before), then keeps the zipapp at ROOT/bin/gpu-train-agent
# (written atomically, only when it changed) and runs it in this process, importing it from a folder
# unpacked beside it once per version (UNPACKED): Python compiles a zip's modules anew on every run, a
# folder's once (about 10 ms less a call). Each use touches the folder; another version's goes when
# unused for a day (a call of that version may still be importing from it), a half-made one after an
# hour; a disk too full to unpack runs the zipapp itself. The wrapper, cron and systemd run the zipapp.


def lean(source: bytes) -> bytes:
    """``source`` without its comments and docstrings, each line where it was (a traceback on the host names
    the line of the checkout): every call carries the agent, and they were a third of the packed bytes."""
    docs = {(n.body[0].lineno, n.body[0].col_offset) for n in ast.walk(ast.parse(source)) if _docstring(n)}  # type: ignore[attr-defined]
    tokens = []
    for t in tokenize.tokenize(io.BytesIO(source).readline):
        if t.type == tokenize.STRING and t.start in docs:  # an empty string over as many lines
            t = t._replace(string=f'"""{chr(10) * t.string.count(chr(10))}"""' if "\n" in t.string else '""')
        if t.type != tokenize.COMMENT:
            tokens.append(t)
    text = tokenize.untokenize(tokens)  # bytes, in the source's encoding (tokenize's first token)
    return re.sub(rb"[ \t]+\n", b"\n", text if isinstance(text, bytes) else text.encode())


def _docstring(node: ast.AST) -> bool:
    """Whether ``node`` (a module, class or function) opens with a docstring."""
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
BOOTSTRAP = (
    GUARD
    + f"""
import base64,json,sys,zlib
try:
    r=secure_root(sys.argv[3])
except (UnsafeRoot,OSError) as e:
    print(json.dumps({{'error':str(e)}}),file=sys.stderr if sys.argv[4:5]==['logs'] else sys.stdout);sys.exit(2)
z=zlib.decompress(base64.b64decode(sys.argv.pop(1)))
p=os.path.join(r,'bin','gpu-train-agent')
try:
    f=open(p,'rb');o=f.read();f.close()
except OSError:
    o=b''
if o!=z:
    os.makedirs(os.path.dirname(p),exist_ok=True);t=p+'.tmp.%d'%os.getpid()
    with os.fdopen(os.open(t,os.O_WRONLY|os.O_CREAT|os.O_EXCL|os.O_NOFOLLOW,0o700),'wb') as f:f.write(z)
    os.replace(t,p)
d=os.path.join(r,'bin','{UNPACKED}%08x-%d'%(zlib.crc32(z),len(z)))
try:
    if os.path.isdir(d):
        os.utime(d)
    else:
        import io,shutil,time,zipfile
        t=d+'.tmp.%d'%os.getpid()
        zipfile.ZipFile(io.BytesIO(z)).extractall(t)
        try:
            os.rename(t,d)
        except OSError:
            shutil.rmtree(t,ignore_errors=True)
        for n in os.listdir(os.path.dirname(d)):
            q=os.path.join(r,'bin',n)
            if n.startswith('{UNPACKED}') and q!=d and time.time()-os.lstat(q).st_mtime>(3600 if '.tmp.' in n else 86400):
                shutil.rmtree(q,ignore_errors=True)
    sys.argv[0]=p;sys.path.insert(0,d)
except OSError:
    sys.argv[0]=p;sys.path.insert(0,p)
from {PACKAGE}.cli import main
sys.exit(main(sys.argv[1:]))
"""
)


def build(sources: dict[str, bytes], contract: bytes | None = None) -> bytes:
    """A zipapp of ``sources`` (name -> bytes) under PACKAGE and the CARRIED core modules as ``gpu_train.NAME``
    (``contract``: another contract's bytes; the agent imports them as the laptop does), plus its __main__, all
    ``lean``: same input, same bytes."""
    files = {f"{PACKAGE}/{name}": lean(data) for name, data in sources.items()}
    files["gpu_train/__init__.py"] = b""
    for name in CARRIED:
        files[f"gpu_train/{name}"] = lean((CORE / name).read_bytes())
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
def packed_payload() -> str:
    """``pack(payload())``, built once per checkout (``cached``)."""
    sources = {p.name: p.read_bytes() for p in sorted(HERE.glob("*.py")) if p.name not in LAPTOP_ONLY}
    inputs = [name.encode() + b"\0" + data for name, data in sources.items()]
    inputs += [(CORE / name).read_bytes() for name in CARRIED]
    return cached("agent", inputs, lambda: pack(build(sources)))


@functools.lru_cache(maxsize=1)
def payload() -> bytes:
    """This checkout's agent as a zipapp (built once per process, in memory)."""
    return zlib.decompress(base64.b64decode(packed_payload()))


def pack(zipapp: bytes) -> str:
    """The zipapp as it travels on the command line: deflated (across files, unlike the zip's own
    entries), base64."""
    return base64.b64encode(zlib.compress(zipapp, 9)).decode()


def digest(zipapp: bytes) -> str:
    return hashlib.sha256(zipapp).hexdigest()


def agent_command(root: str, *args: str, cli: str, zipapp: bytes | None = None) -> str:
    """A shell command that runs the agent shipped inline (no file needed on the host yet).

    The zipapp travels compressed on the command line: one SSH exec, no stdin, no upload. ``cli``
    is the laptop's command the agent's messages name (the Environment's: ``Target.cli``).
    """
    packed = packed_payload() if zipapp is None else pack(zipapp)
    # The system Python when there is one: it starts fastest and no environment manager wraps it.
    run = shlex.join(["-I", "-S", "-c", BOOTSTRAP, packed, "--root", root, *args])
    named = shlex.quote(f"{CLI_ENV}={cli}")
    return f'p=/usr/bin/python3; [ -x "$p" ] || p=python3; exec env {named} "$p" {run}'
