"""uv on the host: fetched once from the package index the host's pip uses, kept at
REMOTE_ROOT/tools/uv-VERSION/uv.

uv is a static binary in a wheel (about 18 MB). The host downloads it at its own network's speed,
for its own architecture, from the index its pip is configured with (PIP_INDEX_URL, pip.conf), over
https only (plain http only to the host itself; no redirect to http). The wheel taken must be one of
the pinned version's wheels named in gpu_train/data/uv-wheels.json (carried in the zipapp; written by
scripts/dev/uv-pins from PyPI) and match that table's sha256: whatever hash the index page gives is not
used, so an index that is itself hostile cannot choose the bytes. A host that already has uv on PATH
uses that one (the host's own, as trusted as its Python). Where none can
be had (no index reachable, a private index that needs credentials), the install falls back to pip
and says why; the failure is remembered for an hour so that each run does not wait for it again.
"""

from __future__ import annotations

import configparser
import contextlib
import fcntl
import hashlib
import html.parser
import io
import ipaddress
import json
import os
import pkgutil
import platform
import re
import shutil
import time
import urllib.parse
import urllib.request
import zipfile
from http.client import HTTPMessage
from typing import IO, Any


def pinned_wheels() -> dict[str, Any]:
    """gpu_train/data/uv-wheels.json: {"version": V, "wheels": {wheel file name: sha256}}, the only uv a
    host fetches. In the zipapp beside the carried modules (agent/bundle.py CARRIED_DATA)."""
    data = pkgutil.get_data("gpu_train", "data/uv-wheels.json")
    if data is None:
        raise OSError("gpu_train/data/uv-wheels.json is missing")
    doc: dict[str, Any] = json.loads(data.decode("utf-8"))
    return doc


PINS = pinned_wheels()
UV_VERSION = PINS["version"]
DEFAULT_INDEX = "https://pypi.org/simple"
RETRY_AFTER_S = 3600  # how long a failed fetch is not tried again
TIMEOUT_S = 30
MAX_BYTES = 128 << 20  # an index page or uv's wheel (about 18 MB): a hostile index's endless answer stops here


def pip_config_files(env: dict[str, str]) -> list[str]:
    """pip's configuration files, in the order pip reads them (later ones win)."""
    home = os.path.expanduser("~")
    xdg = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    files = ["/etc/xdg/pip/pip.conf", "/etc/pip.conf", os.path.join(home, ".pip", "pip.conf"), os.path.join(xdg, "pip", "pip.conf")]
    if env.get("VIRTUAL_ENV"):
        files.append(os.path.join(env["VIRTUAL_ENV"], "pip.conf"))
    if env.get("PIP_CONFIG_FILE"):
        files.append(env["PIP_CONFIG_FILE"])
    return files


def pip_index(env: dict[str, str], configs: list[str]) -> dict[str, Any]:
    """pip's index settings as it would use them: PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS,
    PIP_CERT, else the config files' [global] or [install] index-url, extra-index-url, find-links,
    cert, else PyPI."""
    found: dict[str, Any] = {}
    for text in configs:
        parser = configparser.ConfigParser(interpolation=None)
        with contextlib.suppress(configparser.Error):
            parser.read_string(text)
            for section in ("global", "install"):
                if parser.has_section(section):
                    for key in ("index-url", "extra-index-url", "find-links", "cert"):
                        found[key] = parser[section].get(key, found.get(key))
    return {
        "index": (env.get("PIP_INDEX_URL") or found.get("index-url") or DEFAULT_INDEX).strip(),
        "extra": (env.get("PIP_EXTRA_INDEX_URL") or found.get("extra-index-url") or "").split(),
        "findLinks": (env.get("PIP_FIND_LINKS") or found.get("find-links") or "").split(),
        "cert": env.get("PIP_CERT") or found.get("cert"),
    }


def read_pip_index(env: dict[str, str]) -> dict[str, Any]:
    texts = []
    for path in pip_config_files(env):
        with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as f:
            texts.append(f.read())
    return pip_index(env, texts)


def local_missing(location: str) -> bool:
    """A local index or folder that is not there (pip ignores one with a warning; uv would fail)."""
    path = urllib.parse.urlsplit(location).path if location.startswith("file:") else location
    return "://" not in location.replace("file://", "", 1) and not os.path.exists(path)


def uv_index_env(index: dict[str, Any]) -> dict[str, str]:
    """The same indexes for uv's installs (uv does not read pip's settings). With extra indexes, uv is
    told to pick the best version across all of them, as pip does."""
    out = {"UV_DEFAULT_INDEX": index["index"]}
    extra = [u for u in index["extra"] if not local_missing(u)]
    links = [u for u in index["findLinks"] if not local_missing(u)]
    if extra:
        out.update(UV_INDEX=" ".join(extra), UV_INDEX_STRATEGY="unsafe-best-match")
    if links:
        out["UV_FIND_LINKS"] = ",".join(links)
    if index.get("cert"):  # the CA bundle pip trusts (a proxy's own CA, say): uv trusts it too
        out["SSL_CERT_FILE"] = index["cert"]
    return out


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(v for k, v in attrs if k == "href" and v)


def index_links(page: str, page_url: str) -> list[tuple[str, str]]:
    """(file name, absolute URL with its #sha256= fragment) of a PEP 503 project page."""
    parser = _Links()
    parser.feed(page)
    out = []
    for href in parser.hrefs:
        url = urllib.parse.urljoin(page_url, href)
        out.append((urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1]), url))
    return out


def platform_tags(machine: str, glibc: bool) -> tuple[str, ...]:
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine.lower())
    return (f"manylinux_2_17_{arch}", f"manylinux2014_{arch}") if glibc else (f"musllinux_1_1_{arch}",)


def pick_wheel(links: list[tuple[str, str]], version: str, tags: tuple[str, ...]) -> tuple[str, str] | None:
    """uv's wheel of ``version`` for this platform among an index page's files."""
    for name, url in links:
        m = re.fullmatch(rf"uv-{re.escape(version)}-py3-none-([\w.]+)\.whl", name)
        if m and set(m.group(1).split(".")) & set(tags):
            return name, url
    return None


def has_glibc() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (AttributeError, ValueError, OSError):
        return False


def uv_home(root: str) -> str:
    return os.path.join(root, "tools", f"uv-{UV_VERSION}")


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def transport_problem(url: str) -> str | None:
    """Why uv is not fetched from ``url``, or None: https only (plain http can be rewritten on the way),
    except to the host itself (a loopback index or proxy is the host's own, as trusted as its uv on PATH)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        return None
    if parts.scheme == "http" and loopback(parts.hostname or ""):
        return None
    return f"{parts.scheme}://{parts.hostname or ''} is not https: uv is fetched over https only"


class _HttpsOnly(urllib.request.HTTPRedirectHandler):
    """A redirect to a place ``transport_problem`` refuses (https to plain http) is not followed."""

    def redirect_request(
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: HTTPMessage, newurl: str
    ) -> urllib.request.Request | None:
        if transport_problem(newurl):
            raise ValueError(f"a redirect to {urllib.parse.urlsplit(newurl).scheme}: refused")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _get(url: str) -> bytes:
    if (why := transport_problem(url)) is not None:
        raise ValueError(why)
    request = urllib.request.Request(url, headers={"Accept": "text/html", "User-Agent": f"gpu-train (uv {UV_VERSION})"})
    with urllib.request.build_opener(_HttpsOnly).open(request, timeout=TIMEOUT_S) as response:
        data: bytes = response.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"{url} answers more than {MAX_BYTES >> 20} MiB: not uv")
    return data


def fetch_uv(root: str, index: str) -> str:
    """Download uv's wheel from ``index``, check it against the pinned table (PINS), keep its binary; the
    binary's path. The page's own #sha256= is not used: a hostile index would give its substitute's."""
    pins = PINS
    page_url = index.rstrip("/") + "/uv/"
    links = [(n, u) for n, u in index_links(_get(page_url).decode("utf-8", "replace"), page_url) if n in pins["wheels"]]
    chosen = pick_wheel(links, UV_VERSION, platform_tags(platform.machine(), has_glibc()))
    if chosen is None:
        raise ValueError(f"{page_url} has none of uv {UV_VERSION}'s pinned wheels for {platform.machine()}")
    name, url = chosen
    data = _get(urllib.parse.urlsplit(url)._replace(fragment="").geturl())
    if hashlib.sha256(data).hexdigest() != pins["wheels"][name]:
        raise ValueError(f"{name} from {page_url} is not uv {UV_VERSION} as published: its sha256 is not the pinned one")
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        binary = z.read(f"uv-{UV_VERSION}.data/scripts/uv")
    home = uv_home(root)
    tmp = f"{home}.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    with open(os.path.join(tmp, "uv"), "wb") as f:
        f.write(binary)
    os.chmod(os.path.join(tmp, "uv"), 0o755)
    with open(os.path.join(tmp, "source.json"), "w") as f:
        json.dump({"wheel": name, "index": index, "sha256": pins["wheels"][name]}, f)
    shutil.rmtree(home, ignore_errors=True)
    os.rename(tmp, home)
    return os.path.join(home, "uv")


def verified_copy(root: str) -> bool:
    """Whether REMOTE_ROOT/tools/uv-VERSION holds a uv this code fetched against the pinned table (its
    source.json names a pinned wheel and its hash). A copy an earlier gpu-train fetched with the index
    page's own hash says neither: it is fetched again rather than trusted."""
    try:
        with open(os.path.join(uv_home(root), "source.json")) as f:
            source = json.load(f)
        return PINS["wheels"].get(source["wheel"]) == source["sha256"] and os.access(os.path.join(uv_home(root), "uv"), os.X_OK)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def find_uv(root: str, env: dict[str, str]) -> tuple[str | None, str]:
    """(uv's path, where it came from) or (None, why there is none): gpu-train's copy on REMOTE_ROOT,
    else the host's own on PATH, else fetched now from the host's index."""
    ours = os.path.join(uv_home(root), "uv")
    if verified_copy(root):
        return ours, f"uv {UV_VERSION} in REMOTE_ROOT/tools"
    on_path = shutil.which("uv", path=env.get("PATH"))
    if on_path:
        return on_path, f"the host's own uv, {on_path}"
    failed = f"{uv_home(root)}.failed"
    os.makedirs(os.path.dirname(failed), exist_ok=True)
    with open(f"{uv_home(root)}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one download per host, whatever number of runs start together
        if verified_copy(root):
            return ours, f"uv {UV_VERSION} in REMOTE_ROOT/tools"
        with contextlib.suppress(OSError):
            if time.time() - os.stat(failed).st_mtime < RETRY_AFTER_S:
                with open(failed) as f:
                    return None, f.read().strip()
        index = read_pip_index(env)["index"]
        try:
            return fetch_uv(root, index), f"uv {UV_VERSION}, fetched now from {index}"
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
            why = f"uv {UV_VERSION} could not be fetched from {index} ({e}); tried again after an hour"
            with open(failed, "w") as f:
                f.write(why)
            return None, why
