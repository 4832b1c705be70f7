"""The bootstrap: what every agent call runs first, before the agent exists on the host.

It runs as ``python3 -I -S -c GUARD+BOOTSTRAP VERSION PACKED --root ROOT SUBCOMMAND ...`` (agent/bundle.py
builds the command: PACKED is the zipapp, xz-compressed and base85; VERSION its CRC-32 and size, as
``version``; -I: nothing from the login folder or PYTHON* variables is imported). guard.py's source runs
just before this one, so ``secure_root`` is defined: ROOT is checked to be the login user's alone before
anything is written. Then the zipapp is kept at ROOT/bin/gpu-train-agent (written atomically, only when
it changed) and run in this process, imported from a folder unpacked beside it once per version
(UNPACKED; on disk before its rename names it, since its name is all a later call checks): Python
compiles a zip's modules anew on every run, a folder's once (about 10 ms less a call).
When both are already this version (every call but a new version's first), PACKED is not even decoded
(about 11 ms less). Each use touches the folder; another version's goes when unused for a day (a call of
that version may still be importing from it) and no run's wrapper holds it, a half-made one after an
hour; a disk too full to unpack runs the zipapp itself. A run's wrapper runs from the folder too (and
holds it while it runs: agent/source.py); cron and systemd run the zipapp.

A real module (linted, type-checked, tested) that the laptop sends as text: bundle.py replaces the
two imports marked INLINED with their values, since on the host nothing can be imported yet. Not in
the zipapp (bundle.LAPTOP_ONLY). Standard library only, Python 3.8.
"""

import base64
import gc
import importlib
import json
import os
import sys
import zlib

from agent.guard import UnsafeRoot, secure_root  # INLINED: guard.py's source runs just before this one
from gpu_train.contract import UNPACKED  # INLINED: the value, as a literal

PACKAGE = "gpu_train_agent"  # the package's name inside the zipapp (bundle.PACKAGE)


def version(zipapp: bytes) -> str:
    """What names a zipapp's version: its CRC-32 and size (the unpacked folder's name; bundle.py sends it)."""
    return f"{zlib.crc32(zipapp):08x}-{len(zipapp)}"


def installed_version(path: str) -> str:
    """The version of the zipapp installed at ``path`` ("" when there is none)."""
    try:
        with open(path, "rb") as f:
            return version(f.read())
    except OSError:
        return ""


def install(zipapp: bytes, root: str) -> str:
    """ROOT/bin/gpu-train-agent holding ``zipapp``, rewritten (atomically) only when its bytes differ."""
    path = os.path.join(root, "bin", "gpu-train-agent")
    try:
        with open(path, "rb") as f:
            old = f.read()
    except OSError:
        old = b""
    if old != zipapp:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp.{os.getpid()}"
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700), "wb") as f:
            f.write(zipapp)
            f.flush()
            os.fsync(f.fileno())  # (what a reboot's resume runs: on disk before its name)
        os.replace(tmp, path)
    return path


def unpacked(zipapp: bytes, root: str) -> str:
    """The folder this version is unpacked in (made once, touched on each use); others' old folders go."""
    import time

    folder = os.path.join(root, "bin", f"{UNPACKED}{version(zipapp)}")
    if os.path.isdir(folder):
        os.utime(folder)
        return folder
    import io
    import shutil
    import zipfile

    tmp = f"{folder}.tmp.{os.getpid()}"
    zipfile.ZipFile(io.BytesIO(zipapp)).extractall(tmp)
    durable(tmp)
    try:
        os.rename(tmp, folder)
    except OSError:  # another call unpacked it first
        shutil.rmtree(tmp, ignore_errors=True)
    durable(os.path.dirname(folder), files=False)
    for name in os.listdir(os.path.dirname(folder)):
        other = os.path.join(root, "bin", name)
        old = time.time() - os.lstat(other).st_mtime > (3600 if ".tmp." in name else 86400)
        if name.startswith(UNPACKED) and other != folder and old:
            remove_unheld(other)
    return folder


def remove_unheld(folder: str) -> None:
    """Remove ``folder`` unless a run's wrapper imports from it (it holds a shared lock on it for its life:
    a run may train for days past the day after which an unused version's folder goes)."""
    import fcntl
    import shutil

    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        shutil.rmtree(folder, ignore_errors=True)
    except OSError:  # held
        pass
    finally:
        os.close(fd)


def durable(folder: str, files: bool = True) -> None:
    """``folder``'s files (with ``files``) and folders on disk (fsync) before a rename names it complete: its
    name is all a later call checks, so a machine reset soon after must not leave this version's folder
    holding empty files (ext4 may write the rename first), on which every call of this version would fail."""
    for where, _, names in os.walk(folder) if files else [(folder, [], [])]:
        for path in [*(os.path.join(where, n) for n in names), where]:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def refuse(why: str) -> int:
    """The call's error said as its JSON answer (on stderr for `logs`, whose stdout is the log); its exit status."""
    print(json.dumps({"error": why}), file=sys.stderr if sys.argv[5:6] == ["logs"] else sys.stdout)
    return 2


def main() -> None:
    try:  # sys.argv: -c VERSION PACKED --root ROOT SUBCOMMAND ...
        root = secure_root(sys.argv[4])
    except (UnsafeRoot, OSError) as e:
        sys.exit(refuse(str(e)))
    sent, packed = sys.argv[1:3]  # (taken off sys.argv only once every refusal is said: `refuse` reads it)
    path = os.path.join(root, "bin", "gpu-train-agent")
    folder = os.path.join(root, "bin", f"{UNPACKED}{sent}")
    if os.path.isdir(folder) and installed_version(path) == sent:  # this version, installed and unpacked
        os.utime(folder)
    else:
        try:
            import lzma
        except ImportError:  # a Python built without liblzma: say so rather than a traceback
            sys.exit(refuse("this host's python3 lacks the standard library's lzma module: install the distribution's full python3"))
        zipapp = lzma.decompress(base64.b85decode(packed))
        path = install(zipapp, root)
        try:
            folder = unpacked(zipapp, root)
        except OSError:  # a disk too full to unpack: the zipapp itself
            folder = path
    del sys.argv[1:3]
    sys.argv[0] = path
    sys.path.insert(0, folder)
    code = importlib.import_module(PACKAGE + ".cli").main(sys.argv[1:])
    gc.freeze()  # the last full collection at exit would walk every object only to free none (gpu_train/launcher.py)
    sys.exit(code)


if __name__ == "__main__":  # `python3 -c` runs it as __main__; a test imports it
    main()
