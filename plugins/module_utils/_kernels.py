# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Kernel (tensor) caches of tt-inference-server: pack a complete cache into a store, deploy one from it.

A cache lives at ``<volume>/tt_metal_cache/cache_<model_name>/<mesh>`` (TT_CACHE_PATH). A store entry is
keyed by model_name, mesh, impl_id, tt_metal_commit and vllm_commit and holds three files:
``kernels.tar.zst`` (a tar of the cache directory compressed with the zstd program), its sha256 in
``kernels.tar.zst.sha256`` (sha256sum format) and ``manifest.json`` (the key, counts, sha256). The manifest
is written last: an entry without one is incomplete and never read.

A marker ``cache_<model_name>/.ttfleet-kernels-<mesh>.json`` beside the cache records the key of a cache this
code deployed or harvested, so that a cache built by one tt_metal_commit is never mixed with another.

Pure standard library; the host needs the ``zstd`` program (Python 3.11 has no zstd module).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.parse

from ansible.module_utils.urls import open_url

from ansible_collections.ttfleet.inference.plugins.module_utils._s3 import S3Error
from ansible_collections.ttfleet.inference.plugins.module_utils._spec import tt_metal_cache_subdir
from ansible_collections.ttfleet.inference.plugins.module_utils._weights import Progress

KEY_FIELDS = ("model_name", "mesh", "impl_id", "tt_metal_commit", "vllm_commit")
ARCHIVE_NAME = "kernels.tar.zst"
SHA_NAME = ARCHIVE_NAME + ".sha256"
MANIFEST_NAME = "manifest.json"
MARKER_PREFIX = ".ttfleet-kernels-"
TEMP_PREFIX = ".ttfleet-tmp-"
ASIDE_INFIX = ".ttfleet-aside-"
SCHEMA = 1
KIND = "ttfleet.kernel_cache"
NO_VLLM = "none"
CHUNK = 1 << 20
FILE_MODE = 0o644
EXEC_MODE = 0o755
DIR_MODE = 0o755
_MANIFEST_MAX = 1 << 20
# Names that mean a writer is still at work (or died mid-write): a cache holding one is not complete.
DEFAULT_TEMP_PATTERNS = (
    "*.tmp",
    "*.temp",
    "*.part",
    "*.partial",
    "*.incomplete",
    "*.lock",
    "*.swp",
    "*~",
    ".nfs*",
    TEMP_PREFIX + "*",
)
_COMPONENT_RE = re.compile(r"^[A-Za-z0-9(][A-Za-z0-9._+,()-]*$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")


class KernelError(Exception):
    """A request that cannot be carried out; the message says what, which input and how to fix it."""


# ---------------------------------------------------------------------------
# Keys and paths


def check_key(key):
    """The key with every field checked; vllm_commit may be empty (media and forge engines have none)."""
    checked = {}
    for field in KEY_FIELDS:
        value = key.get(field)
        value = "" if value is None else str(value)
        if field == "vllm_commit" and value in ("", NO_VLLM):
            checked[field] = None
            continue
        if not value:
            raise KernelError(f"{field} is required: take it from the model spec (ttfleet.inference.model_spec)")
        if not _COMPONENT_RE.match(value) or value in (".", ".."):
            raise KernelError(
                f"{field} {value!r} is not usable as a store path component: letters, digits and . _ + , ( ) - only"
            )
        checked[field] = value
    return checked


def key_text(key):
    vllm = key.get("vllm_commit") or NO_VLLM
    return (
        f"{key['model_name']} on {key['mesh']} ({key['impl_id']}, tt_metal_commit {key['tt_metal_commit']}, "
        f"vllm_commit {vllm})"
    )


def entry_parts(key):
    """Store path of an entry, relative to the store root."""
    return [key["model_name"], key["mesh"], key["impl_id"], key["tt_metal_commit"], key.get("vllm_commit") or NO_VLLM]


def cache_path(volume, key):
    return os.path.join(volume, tt_metal_cache_subdir(key["model_name"], key["mesh"]))


def marker_path(volume, key):
    return os.path.join(volume, "tt_metal_cache", f"cache_{key['model_name']}", f"{MARKER_PREFIX}{key['mesh']}.json")


def key_mismatch(found, wanted):
    """Fields on which two keys differ, as ``[(field, found, wanted)]``."""
    return [
        (field, found.get(field), wanted.get(field))
        for field in KEY_FIELDS
        if (found.get(field) or None) != (wanted.get(field) or None)
    ]


def mismatch_text(where, found, wanted):
    diffs = key_mismatch(found, wanted)
    fields = {field for field, _a, _b in diffs}
    parts = [f"{field} {a or NO_VLLM} (wanted {b or NO_VLLM})" for field, a, b in diffs]
    text = f"{where} was built for {', '.join(parts)}"
    if "tt_metal_commit" in fields:
        text += (
            f"; its tt_metal_commit {found.get('tt_metal_commit')} differs from this spec's tt_metal_commit "
            f"{wanted.get('tt_metal_commit')}, and kernel caches are never mixed across tt_metal_commits"
        )
    return text


# ---------------------------------------------------------------------------
# Looking at a cache on the host


def _matches(name, patterns):
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def scan_cache(path, temp_patterns=DEFAULT_TEMP_PATTERNS):
    """Regular files and directories under ``path`` (symlinks are not followed).

    Returns ``{"exists", "files", "bytes", "newest_mtime", "entries", "temp", "special"}`` where
    ``entries`` is a sorted list of ``(relpath, kind, size, mtime_ns, mode)`` and ``temp``/``special``
    list the relative paths of in-progress files and of anything that is neither a file nor a directory.
    """
    result = {"exists": False, "files": 0, "bytes": 0, "newest_mtime": None, "entries": [], "temp": [], "special": []}
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return result
    if not os.path.isdir(path):
        raise KernelError(f"{path} exists but is not a directory; move it away so the kernel cache can go there")
    result["exists"] = True
    newest = st.st_mtime
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(os.path.join(path, rel_dir) if rel_dir else path) as entries:
            for entry in entries:
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                est = entry.stat(follow_symlinks=False)
                newest = max(newest, est.st_mtime)
                if _matches(entry.name, temp_patterns):
                    result["temp"].append(rel)
                if entry.is_dir(follow_symlinks=False):
                    result["entries"].append((rel, "dir", 0, est.st_mtime_ns, est.st_mode & 0o777))
                    stack.append(rel)
                elif entry.is_file(follow_symlinks=False):
                    result["entries"].append((rel, "file", est.st_size, est.st_mtime_ns, est.st_mode & 0o777))
                    result["files"] += 1
                    result["bytes"] += est.st_size
                else:
                    result["special"].append(rel)
    result["entries"].sort()
    result["temp"].sort()
    result["special"].sort()
    result["newest_mtime"] = newest
    return result


def completeness_problems(scan, path, quiet_seconds=0, now=None):
    """Why the scanned cache is not complete (empty when it is).

    Complete means: the directory exists, holds at least one non-empty regular file, holds nothing but
    regular files and directories, no in-progress or temporary file, and nothing in it changed during the
    last ``quiet_seconds`` (a server still capturing traces keeps writing).
    """
    if not scan["exists"]:
        return [f"{path} does not exist"]
    problems = []
    if scan["files"] == 0 or scan["bytes"] == 0:
        problems.append(f"{path} holds no data ({scan['files']} files, {scan['bytes']} bytes)")
    if scan["temp"]:
        problems.append(f"{path} holds in-progress or temporary files: {', '.join(scan['temp'][:5])}")
    if scan["special"]:
        special = ", ".join(scan["special"][:5])
        problems.append(f"{path} holds entries that are neither files nor directories: {special}")
    if quiet_seconds and scan["newest_mtime"] is not None:
        now = time.time() if now is None else now
        age = now - scan["newest_mtime"]
        if age < quiet_seconds:
            problems.append(
                f"{path} changed {max(age, 0):.0f} s ago, less than quiet_seconds={quiet_seconds}: the server may "
                "still be writing kernels; harvest again later"
            )
    return problems


def read_json_file(path, limit=_MANIFEST_MAX):
    try:
        with open(path, "rb") as handle:
            raw = handle.read(limit + 1)
    except FileNotFoundError:
        return None
    if len(raw) > limit:
        raise KernelError(f"{path} is larger than {limit} bytes; it is not a file this collection wrote")
    try:
        data = json.loads(raw)
    except ValueError:
        raise KernelError(f"{path} is not valid JSON; remove it or restore it from the store") from None
    if not isinstance(data, dict):
        raise KernelError(f"{path} does not hold a JSON object; remove it or restore it from the store")
    return data


def atomic_write(path, data, mode=FILE_MODE, owner=None):
    """Write bytes to ``path`` through a temporary file in the same directory and a rename."""
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, f"{TEMP_PREFIX}{os.path.basename(path)}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        if owner is not None and os.geteuid() == 0:
            os.chown(tmp, *owner)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def json_bytes(data):
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def nearest_existing(path):
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def human_bytes(count):
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{value:.1f} TiB"


# ---------------------------------------------------------------------------
# Stores


def build_manifest(key, sha256, archive_bytes, scan, host, evidence, now=None):
    return {
        "schema": SCHEMA,
        "kind": KIND,
        "key": {field: key.get(field) for field in KEY_FIELDS},
        "archive": ARCHIVE_NAME,
        "compression": "zstd",
        "sha256": sha256,
        "archive_bytes": archive_bytes,
        "files": scan["files"],
        "bytes": scan["bytes"],
        "host": host,
        "evidence": evidence,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
    }


def check_manifest(manifest, key, where):
    """A store manifest that describes an archive of exactly ``key``; raises otherwise."""
    if manifest.get("kind") != KIND or manifest.get("schema") != SCHEMA:
        raise KernelError(
            f"{where} is not a kernel cache manifest of schema {SCHEMA}; remove the entry and harvest again"
        )
    found = manifest.get("key") if isinstance(manifest.get("key"), dict) else {}
    if key_mismatch(found, key):
        raise KernelError(
            f"{mismatch_text(where, found, key)}; this store entry is misplaced: remove it and harvest again"
        )
    sha = str(manifest.get("sha256") or "")
    counts = [manifest.get(name) for name in ("files", "bytes", "archive_bytes")]
    if not _HEX64_RE.match(sha) or not all(isinstance(c, int) and c >= 0 for c in counts):
        raise KernelError(f"{where} lacks a sha256, file count or byte counts; remove the entry and harvest again")
    return manifest


def parse_sha_file(text, where):
    fields = text.split()
    if not fields or not _HEX64_RE.match(fields[0].lower()):
        raise KernelError(f"{where} does not start with a sha256; remove the entry and harvest again")
    return fields[0].lower()


class PathStore:
    """A directory (local disk or an NFS share) holding ``<model>/<mesh>/<impl_id>/<tt_metal_commit>/<vllm>/``."""

    kind = "path"

    def __init__(self, root):
        if not root or not os.path.isabs(root):
            raise KernelError(f"store_path {root!r} must be an absolute directory, for example /mnt/kernel-store")
        self.root = os.path.normpath(root)

    def describe(self, key=None):
        return os.path.join(self.root, *entry_parts(key)) if key else self.root

    def entry_dir(self, key):
        return os.path.join(self.root, *entry_parts(key))

    def read_manifest(self, key):
        return read_json_file(os.path.join(self.entry_dir(key), MANIFEST_NAME))

    def read_sha(self, key):
        path = os.path.join(self.entry_dir(key), SHA_NAME)
        try:
            with open(path, encoding="ascii", errors="replace") as handle:
                return parse_sha_file(handle.read(4096), path)
        except FileNotFoundError:
            raise KernelError(f"{path} is missing; remove the entry and harvest again") from None

    def open_archive(self, key):
        return open(os.path.join(self.entry_dir(key), ARCHIVE_NAME), "rb")

    def siblings(self, key):
        """Keys of complete entries for the same model, mesh and impl_id with other commits."""
        base = os.path.join(self.root, key["model_name"], key["mesh"], key["impl_id"])
        found = []
        try:
            commits = sorted(os.listdir(base))
        except OSError:
            return found
        for tmc in commits:
            try:
                vllms = sorted(os.listdir(os.path.join(base, tmc)))
            except OSError:
                continue
            for vllm in vllms:
                if os.path.isfile(os.path.join(base, tmc, vllm, MANIFEST_NAME)):
                    found.append({**key, "tt_metal_commit": tmc, "vllm_commit": None if vllm == NO_VLLM else vllm})
        return [k for k in found if key_mismatch(k, key)]

    def writer(self, key):
        return _PathWriter(self, key)


class _PathWriter:
    """Writes an entry: archive and sha into temporary names, then renames, manifest last."""

    def __init__(self, store, key):
        self.dir = store.entry_dir(key)
        self.tmp_archive = os.path.join(self.dir, f"{TEMP_PREFIX}{ARCHIVE_NAME}.{os.getpid()}")

    def prepare(self):
        os.makedirs(self.dir, mode=DIR_MODE, exist_ok=True)
        for name in os.listdir(self.dir):
            if name.startswith(TEMP_PREFIX):
                os.unlink(os.path.join(self.dir, name))
        return self.tmp_archive

    def space_path(self):
        return nearest_existing(self.dir)

    def commit(self, sha256, manifest):
        # A replaced entry must never pair the new archive with the old manifest: drop the manifest first.
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.dir, MANIFEST_NAME))
        os.replace(self.tmp_archive, os.path.join(self.dir, ARCHIVE_NAME))
        atomic_write(os.path.join(self.dir, SHA_NAME), f"{sha256}  {ARCHIVE_NAME}\n".encode())
        atomic_write(os.path.join(self.dir, MANIFEST_NAME), json_bytes(manifest))

    def abort(self):
        with contextlib.suppress(OSError):
            os.unlink(self.tmp_archive)


class HttpStore:
    """Read-only store over HTTP with the path store's layout (a peer's temporary server, a web server)."""

    kind = "http"

    def __init__(self, url, timeout=60):
        if not re.match(r"^https?://[^/\s]+", url or ""):
            raise KernelError(f"store_url {url!r} is not an http(s) URL, for example http://peer-host:8765/")
        self.url = url.rstrip("/") + "/"
        self.timeout = timeout

    def _url(self, key, name):
        return self.url + "/".join(urllib.parse.quote(p, safe="") for p in [*entry_parts(key), name])

    def describe(self, key=None):
        return self._url(key, "") if key else self.url

    def _open(self, key, name, missing_ok=False):
        url = self._url(key, name)
        try:
            return open_url(url, method="GET", timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 404 and missing_ok:
                return None
            raise KernelError(
                f"{url} answered HTTP {exc.code}; check store_url and that the store is serving"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise KernelError(f"{url} is unreachable: {getattr(exc, 'reason', exc)}; check store_url") from None

    def read_manifest(self, key):
        resp = self._open(key, MANIFEST_NAME, missing_ok=True)
        if resp is None:
            return None
        with resp:
            raw = resp.read(_MANIFEST_MAX + 1)
        try:
            data = json.loads(raw)
        except ValueError:
            raise KernelError(f"{self._url(key, MANIFEST_NAME)} is not JSON; is store_url a kernel store?") from None
        if not isinstance(data, dict):
            raise KernelError(f"{self._url(key, MANIFEST_NAME)} is not a JSON object; is store_url a kernel store?")
        return data

    def read_sha(self, key):
        with self._open(key, SHA_NAME) as resp:
            return parse_sha_file(resp.read(4096).decode("ascii", "replace"), self._url(key, SHA_NAME))

    def open_archive(self, key):
        return self._open(key, ARCHIVE_NAME)

    def siblings(self, key):
        return []

    def writer(self, key):
        raise KernelError(f"the http store {self.url} is read-only; harvest into a path or s3 store")


class _S3Body:
    """A GET's body as a readable file object that closes its connection."""

    def __init__(self, resp):
        self.resp = resp

    def read(self, size=-1):
        return self.resp.read(size)

    def close(self):
        self.resp.close()
        self.resp.connection_to_close.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class S3Store:
    """Entries under ``s3://<bucket>/<prefix>/`` with the path store's layout, through module_utils._s3.

    Archives are packed into ``spool`` on the host (a directory with room for one archive) and uploaded from
    there; the manifest is uploaded last and removed first when an entry is replaced.
    """

    kind = "s3"

    def __init__(self, client, bucket, prefix="", spool=None):
        if not bucket:
            raise KernelError("s3_bucket is required for the s3 store, for example kernel-caches")
        self.client = client
        self.bucket = bucket
        self.prefix = (prefix or "").strip("/")
        self.spool = spool

    def _object(self, key, name=""):
        return "/".join(p for p in [self.prefix, *entry_parts(key), name] if p)

    def describe(self, key=None):
        base = f"s3://{self.bucket}/{self.prefix + '/' if self.prefix else ''}"
        return f"s3://{self.bucket}/{self._object(key)}/" if key else base

    def _call(self, what, func, *args):
        try:
            return func(*args)
        except S3Error as exc:
            raise KernelError(f"{what} failed: {exc}; check the s3 endpoint, bucket and credentials") from None

    def _read_small(self, key, name, missing_ok=False):
        obj = self._object(key, name)
        if self._call(f"HEAD {self.describe(key)}{name}", self.client.head_object, self.bucket, obj) is None:
            if missing_ok:
                return None
            raise KernelError(f"{self.describe(key)}{name} is missing; remove the entry and harvest again")
        resp, _start = self._call(f"GET {self.describe(key)}{name}", self.client.open_object, self.bucket, obj)
        with _S3Body(resp) as body:
            return body.read(_MANIFEST_MAX + 1)

    def read_manifest(self, key):
        raw = self._read_small(key, MANIFEST_NAME, missing_ok=True)
        if raw is None:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            raise KernelError(
                f"{self.describe(key)}{MANIFEST_NAME} is not JSON; remove the entry and harvest again"
            ) from None
        if not isinstance(data, dict):
            raise KernelError(f"{self.describe(key)}{MANIFEST_NAME} is not a JSON object; remove the entry")
        return data

    def read_sha(self, key):
        raw = self._read_small(key, SHA_NAME)
        return parse_sha_file(raw.decode("ascii", "replace"), f"{self.describe(key)}{SHA_NAME}")

    def open_archive(self, key):
        obj = self._object(key, ARCHIVE_NAME)
        resp, _start = self._call(f"GET {self.describe(key)}{ARCHIVE_NAME}", self.client.open_object, self.bucket, obj)
        return _S3Body(resp)

    def siblings(self, key):
        base = "/".join(p for p in [self.prefix, key["model_name"], key["mesh"], key["impl_id"]] if p) + "/"
        listing = self._call(f"listing {self.describe()}", lambda: list(self.client.list_objects(self.bucket, base)))
        found = []
        for item in listing:
            parts = item["key"][len(base) :].split("/")
            if len(parts) == 3 and parts[2] == MANIFEST_NAME:
                found.append(
                    {**key, "tt_metal_commit": parts[0], "vllm_commit": None if parts[1] == NO_VLLM else parts[1]}
                )
        return [k for k in found if key_mismatch(k, key)]

    def writer(self, key):
        if not self.spool:
            raise KernelError("the s3 store needs a spool directory on the host to pack the archive in")
        return _S3Writer(self, key)


class _S3Writer:
    def __init__(self, store, key):
        self.store = store
        self.key = key
        self.tmp_archive = os.path.join(
            store.spool, f"{TEMP_PREFIX}{key['model_name']}-{key['mesh']}.{os.getpid()}.tar.zst"
        )

    def prepare(self):
        os.makedirs(self.store.spool, mode=0o700, exist_ok=True)
        return self.tmp_archive

    def space_path(self):
        return self.store.spool

    def commit(self, sha256, manifest):
        store, key = self.store, self.key
        try:
            store._call(
                "DELETE of the old manifest",
                store.client.delete_object,
                store.bucket,
                store._object(key, MANIFEST_NAME),
            )
            store._call(
                f"upload to {store.describe(key)}",
                store.client.upload_file,
                store.bucket,
                store._object(key, ARCHIVE_NAME),
                self.tmp_archive,
            )
            store._call(
                f"upload to {store.describe(key)}",
                store.client.put_object,
                store.bucket,
                store._object(key, SHA_NAME),
                f"{sha256}  {ARCHIVE_NAME}\n".encode(),
            )
            store._call(
                f"upload to {store.describe(key)}",
                store.client.put_object,
                store.bucket,
                store._object(key, MANIFEST_NAME),
                json_bytes(manifest),
            )
        finally:
            self.abort()

    def abort(self):
        with contextlib.suppress(OSError):
            os.unlink(self.tmp_archive)


# ---------------------------------------------------------------------------
# zstd through its program


def find_zstd(host):
    found = shutil.which("zstd") or next(
        (p for p in ("/usr/bin/zstd", "/usr/local/bin/zstd", "/bin/zstd") if os.access(p, os.X_OK)), None
    )
    if not found:
        raise KernelError(
            f"{host}: the zstd program is missing (kernel cache archives are .tar.zst): install the zstd package "
            "(apt-get install zstd); the role ttfleet.inference.model_cache installs it when a store is set"
        )
    return found


def _tarinfo(name, kind, size, mode):
    info = tarfile.TarInfo(name)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    if kind == "dir":
        info.type = tarfile.DIRTYPE
        info.mode = DIR_MODE
    else:
        info.size = size
        info.mode = EXEC_MODE if mode & 0o111 else FILE_MODE
    return info


def _abort(proc, thread):
    """Stop a zstd pipe and the thread that feeds or drains it."""
    proc.kill()
    thread.join()
    proc.wait()


def pack(cache_dir, scan, out_path, zstd, level=3, progress=None):
    """Tar the scanned entries of ``cache_dir`` through ``zstd`` into ``out_path``.

    Returns ``(sha256, archive_bytes)``, hashed while written (no second pass). A file whose size changes
    while it is read fails the pack: the cache was not complete after all.
    """
    proc = subprocess.Popen(
        [zstd, "-q", f"-{int(level)}", "-T0", "-c", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    digest = hashlib.sha256()
    state = {"bytes": 0, "error": None}

    def drain():
        try:
            with open(out_path, "wb") as out:
                while True:
                    block = proc.stdout.read(CHUNK)
                    if not block:
                        break
                    digest.update(block)
                    out.write(block)
                    state["bytes"] += len(block)
                out.flush()
                os.fsync(out.fileno())
        except BaseException as exc:  # reported by the main thread
            state["error"] = exc
            proc.stdout.close()

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    try:
        with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for rel, kind, size, _mtime, mode in scan["entries"]:
                info = _tarinfo(rel, kind, size, mode)
                if kind == "dir":
                    tar.addfile(info)
                    continue
                full = os.path.join(cache_dir, rel)
                with open(full, "rb") as handle:
                    if os.fstat(handle.fileno()).st_size != size:
                        raise KernelError(f"{full} changed size while the cache was packed; harvest again later")
                    tar.addfile(info, handle)
                if progress is not None:
                    progress.advance(size, rel)
        proc.stdin.close()
    except BaseException:
        _abort(proc, thread)
        raise
    thread.join()
    rc = proc.wait()
    if state["error"] is not None:
        raise KernelError(f"writing {out_path} failed: {state['error']}")
    if rc != 0:
        raise KernelError(f"zstd failed with exit code {rc} while packing {cache_dir}")
    return digest.hexdigest(), state["bytes"]


def _member_path(root, name):
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or name.startswith("/") or ".." in parts:
        raise KernelError(f"the archive holds an unsafe member name {name!r}; it was not written by this collection")
    return os.path.join(root, *parts)


def unpack(source, staging, zstd, max_bytes, owner=None, progress=None):
    """Extract a .tar.zst stream into the existing empty directory ``staging``, hashing the stream as it is read.

    Only regular files and directories are written (no links, devices or absolute/parent paths); writing stops
    once more than ``max_bytes`` come out. Returns ``{"sha256", "archive_bytes", "files", "bytes"}``.
    """
    proc = subprocess.Popen([zstd, "-q", "-d", "-c", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    digest = hashlib.sha256()
    state = {"bytes": 0, "error": None}

    def feed():
        try:
            while True:
                block = source.read(CHUNK)
                if not block:
                    break
                digest.update(block)
                state["bytes"] += len(block)
                proc.stdin.write(block)
                if progress is not None:
                    progress.advance(len(block), ARCHIVE_NAME)
        except BrokenPipeError:
            pass
        except BaseException as exc:  # reported by the main thread
            state["error"] = exc
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    files = total = 0
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                target = _member_path(staging, member.name)
                if member.isdir():
                    os.makedirs(target, mode=DIR_MODE, exist_ok=True)
                    _own(target, DIR_MODE, owner)
                    continue
                if not member.isfile():
                    raise KernelError(
                        f"the archive holds {member.name!r}, which is not a regular file or directory; refused"
                    )
                total += member.size
                if total > max_bytes:
                    raise KernelError(f"the archive unpacks to more than the {max_bytes} bytes its manifest states")
                os.makedirs(os.path.dirname(target), mode=DIR_MODE, exist_ok=True)
                mode = EXEC_MODE if member.mode & 0o111 else FILE_MODE
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(tar.extractfile(member), out, CHUNK)
                _own(target, mode, owner)
                files += 1
        # Read to the end, so the hash covers the whole archive (tar pads past its end-of-archive blocks).
        while proc.stdout.read(CHUNK):
            pass
    except tarfile.TarError as exc:
        _abort(proc, thread)
        raise KernelError(
            f"the archive is not a readable tar.zst ({exc}); remove the store entry and harvest again"
        ) from None
    except BaseException:
        _abort(proc, thread)
        raise
    thread.join()
    rc = proc.wait()
    if state["error"] is not None:
        raise KernelError(f"reading the archive failed: {state['error']}")
    if rc != 0:
        raise KernelError(
            f"zstd could not decompress the archive (exit code {rc}); remove the store entry and harvest again"
        )
    return {"sha256": digest.hexdigest(), "archive_bytes": state["bytes"], "files": files, "bytes": total}


def _own(path, mode, owner):
    os.chmod(path, mode)
    if owner is not None and os.geteuid() == 0:
        os.chown(path, *owner)


def _makedirs_owned(path, owner):
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        os.mkdir(directory, DIR_MODE)
        _own(directory, DIR_MODE, owner)


def remove_tree(path):
    shutil.rmtree(path, ignore_errors=True)


def clear_leftovers(parent, mesh):
    """Staging directories of an interrupted deploy of ``mesh`` (they are ours: TEMP_PREFIX + mesh)."""
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        if name.startswith(f"{TEMP_PREFIX}{mesh}-"):
            remove_tree(os.path.join(parent, name))
            removed.append(name)
    return removed


# ---------------------------------------------------------------------------
# Operations


def check_health(url, timeout=10):
    """None when ``url`` answers HTTP 200, else the reason."""
    try:
        with open_url(url, method="GET", timeout=timeout) as resp:
            if resp.status == 200:
                return None
            return f"{url} answered HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        exc.close()
        return f"{url} answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url} is unreachable ({getattr(exc, 'reason', exc)})"


def _marker(volume, key):
    path = marker_path(volume, key)
    data = read_json_file(path)
    if data is not None and not isinstance(data.get("key"), dict):
        raise KernelError(f"{path} has no key; remove it (it only records where the cache came from)")
    return path, data


def harvest(options, store, check_mode=False, now=None):
    """Pack the complete cache of ``options['volume']`` into ``store`` unless the store already holds the key."""
    key = check_key(options)
    host = options.get("host") or socket.gethostname()
    volume = os.path.normpath(options["volume"])
    path = cache_path(volume, key)
    force = bool(options.get("force"))
    where = f"{host}:{path}"
    marker_file, marker = _marker(volume, key)
    if marker is not None and key_mismatch(marker["key"], key):
        raise KernelError(
            f"{mismatch_text(f'the kernel cache {where} (recorded in {marker_file})', marker['key'], key)}. "
            "Fix: harvest with the key of the spec that built it, or warm this host up with the spec to harvest"
        )
    result = {"changed": False, "action": "none", "cache_path": path, "store": store.describe(key), "key": key}
    existing = store.read_manifest(key)
    if existing is not None and not force:
        check_manifest(existing, key, f"the store entry {store.describe(key)}")
        result.update(
            reason=(
                f"the store already holds {key_text(key)} (from {existing.get('host')}, {existing.get('created_at')})"
            ),
            manifest=existing,
        )
        return result

    scan = scan_cache(path, options.get("temp_patterns") or DEFAULT_TEMP_PATTERNS)
    problems = completeness_problems(scan, where, options.get("quiet_seconds") or 0, now)
    if marker is not None and not key_mismatch(marker["key"], key):
        evidence = f"marker {marker_file} ({marker.get('evidence') or marker.get('source')})"
    elif options.get("require_marker"):
        problems.append(
            f"{host} holds no record ({marker_file}) that its cache of this key is complete; harvest it there first "
            "(tasks_from: harvest, after a warm-up) or deploy it there from a store"
        )
        evidence = None
    elif options.get("warmed"):
        evidence = "operator flag warmed"
    elif options.get("health_url"):
        why = check_health(options["health_url"], options.get("timeout") or 10)
        if why:
            problems.append(f"no evidence of a successful warm-up: {why}")
        evidence = f"health {options['health_url']}"
    else:
        problems.append("no evidence of a successful warm-up: set health_url to the warmed server's /health URL")
        evidence = None
    if problems:
        raise KernelError(
            f"refusing to harvest the incomplete kernel cache of {key_text(key)}: " + "; ".join(problems) + ". "
            "Fix: harvest after a successful warm-up (health_url answering 200, or warmed: true once you have "
            "checked it), with no server writing to the cache"
        )
    result.update(
        changed=True,
        action="harvested",
        files=scan["files"],
        bytes=scan["bytes"],
        evidence=evidence,
        reason=f"packed {scan['files']} files ({human_bytes(scan['bytes'])}) of {where}",
    )
    if check_mode:
        result["reason"] = f"would pack {scan['files']} files ({human_bytes(scan['bytes'])}) of {where}"
        return result
    zstd = find_zstd(host)
    writer = store.writer(key)
    tmp = writer.prepare()
    space = free_bytes(writer.space_path())
    if space < scan["bytes"] // 2:
        writer.abort()
        raise KernelError(
            f"{host}: the store {store.describe()} has {human_bytes(space)} free, too little for an archive of "
            f"{human_bytes(scan['bytes'])} of cache; free space there"
        )
    try:
        progress = Progress(scan["bytes"], options.get("status_file"))
        sha, archive_bytes = pack(path, scan, tmp, zstd, options.get("level") or 3, progress)
        after = scan_cache(path, options.get("temp_patterns") or DEFAULT_TEMP_PATTERNS)
        if after["entries"] != scan["entries"]:
            raise KernelError(f"the kernel cache {where} changed while it was packed; harvest again once it is idle")
        manifest = build_manifest(key, sha, archive_bytes, scan, host, evidence, now)
        writer.commit(sha, manifest)
        progress.write(state="done")
    except BaseException:
        writer.abort()
        raise
    atomic_write(
        marker_file,
        json_bytes(
            {
                "key": manifest["key"],
                "sha256": sha,
                "source": "harvest",
                "evidence": evidence,
                "at": manifest["created_at"],
            }
        ),
        owner=(options.get("owner", 1000), options.get("group", 1000)),
    )
    result.update(manifest=manifest, sha256=sha, archive_bytes=archive_bytes, hashed=True)
    return result


def dir_state(path):
    """``absent``, ``empty`` or ``nonempty``; anything but a directory at ``path`` is an error."""
    try:
        with os.scandir(path) as entries:
            return "nonempty" if next(entries, None) is not None else "empty"
    except FileNotFoundError:
        return "absent"
    except NotADirectoryError:
        raise KernelError(
            f"{path} exists but is not a directory; move it away so the kernel cache can go there"
        ) from None


def local_state(options):
    """What is at the cache path of the key: ``{"path", "marker_file", "kind", "in_place", "aside", "reason"}``.

    ``in_place``: a cache deployed or harvested with this key is there. ``aside``: the cache in the way that a
    deploy moves aside first (only with ``force``). ``reason`` is set when a deploy has nothing to do. A cache
    recorded for another key is refused without ``force``.
    """
    key = check_key(options)
    host = options.get("host") or socket.gethostname()
    volume = os.path.normpath(options["volume"])
    path = cache_path(volume, key)
    where = f"{host}:{path}"
    marker_file, marker = _marker(volume, key)
    # Only whether something is there: a converged host must not walk a cache of tens of thousands of files.
    kind = dir_state(path)
    state = {"path": path, "marker_file": marker_file, "kind": kind, "in_place": False, "aside": None, "reason": None}
    if kind != "nonempty":
        return state
    if marker is not None and not key_mismatch(marker["key"], key):
        state["in_place"] = True
        state["reason"] = f"{where} already holds {key_text(key)} ({marker.get('source')}, {marker.get('at')})"
    elif marker is not None:
        text = mismatch_text(f"the kernel cache {where} (recorded in {marker_file})", marker["key"], key)
        if not options.get("force"):
            raise KernelError(
                f"{text}. Fix: set force: true to move it aside and deploy {key_text(key)}, or serve the spec "
                "it was built for"
            )
        state["aside"] = path
    elif not options.get("force"):
        state["reason"] = (
            f"{where} holds a kernel cache that no store deployed (compiled here or preseeded); it is left as "
            "it is. Set force: true to move it aside and deploy from the store"
        )
    else:
        state["aside"] = path
    return state


def inspect(options):
    """Read-only: whether a deploy of the key would change anything, without asking a store."""
    key = check_key(options)
    state = local_state(options)
    return {
        "changed": False,
        "action": "none",
        "cache_path": state["path"],
        "key": key,
        "in_place": state["in_place"],
        "deployable": state["reason"] is None,
        "reason": state["reason"] or f"{state['path']} can take the kernel cache of {key_text(key)} from a store",
    }


def deploy(options, store, check_mode=False, now=None):
    """Put the store's archive of the key in place at the volume's cache path, verified, staged, renamed."""
    key = check_key(options)
    host = options.get("host") or socket.gethostname()
    owner = (options.get("owner", 1000), options.get("group", 1000))
    state = local_state(options)
    path, marker_file, aside = state["path"], state["marker_file"], state["aside"]
    parent = os.path.dirname(path)
    result = {"changed": False, "action": "none", "cache_path": path, "store": store.describe(key), "key": key}
    if state["reason"]:
        result["reason"] = state["reason"]
        return result

    manifest = store.read_manifest(key)
    if manifest is None:
        others = store.siblings(key)
        if others:
            commits = ", ".join(sorted({f"{k['tt_metal_commit']}/{k.get('vllm_commit') or NO_VLLM}" for k in others}))
            reason = (
                f"the store {store.describe()} holds kernel caches of {key['model_name']} on {key['mesh']} "
                f"({key['impl_id']}) only for tt_metal_commit/vllm_commit {commits}, not for this spec's "
                f"tt_metal_commit {key['tt_metal_commit']} / vllm_commit {key.get('vllm_commit') or NO_VLLM}; kernel "
                "caches are never mixed across tt_metal_commits. Harvest one from a host warmed up with this spec"
            )
        else:
            reason = (
                f"the store {store.describe()} holds no kernel cache of {key_text(key)}; harvest one after a warm-up"
            )
        if options.get("required"):
            raise KernelError(f"{host}: {reason}")
        result.update(reason=reason, missing=True)
        return result
    check_manifest(manifest, key, f"the store entry {store.describe(key)}")
    result.update(manifest=manifest, files=manifest["files"], bytes=manifest["bytes"])
    need = manifest["bytes"] + int(float(options.get("disk_margin_gb") or 0) * (1 << 30))
    space = free_bytes(nearest_existing(parent))
    if space < need:
        raise KernelError(
            f"{host}: {nearest_existing(parent)} has {human_bytes(space)} free; the kernel cache of {key_text(key)} "
            f"needs {human_bytes(manifest['bytes'])} plus the margin of {options.get('disk_margin_gb') or 0} GiB. "
            "Free space on the volume filesystem"
        )
    result.update(changed=True, action="deployed")
    verb = "would deploy" if check_mode else "deployed"
    result["reason"] = (
        f"{verb} {manifest['files']} files ({human_bytes(manifest['bytes'])}) of {key_text(key)} from "
        f"{store.describe(key)}" + (", moving the cache in place aside first" if aside else "")
    )
    if check_mode:
        return result

    zstd = find_zstd(host)
    sha_file = store.read_sha(key)
    if sha_file != manifest["sha256"]:
        raise KernelError(
            f"the store entry {store.describe(key)} is inconsistent: {SHA_NAME} says {sha_file}, the manifest "
            f"{manifest['sha256']}; remove the entry and harvest again"
        )
    _makedirs_owned(parent, owner)
    clear_leftovers(parent, key["mesh"])
    staging = os.path.join(parent, f"{TEMP_PREFIX}{key['mesh']}-{os.getpid()}-{int(time.time())}")
    os.mkdir(staging, DIR_MODE)
    try:
        progress = Progress(manifest["archive_bytes"], options.get("status_file"))
        with store.open_archive(key) as source:
            got = unpack(source, staging, zstd, manifest["bytes"], owner, progress)
        progress.write(state="done")
        problems = []
        if got["sha256"] != manifest["sha256"]:
            problems.append(f"sha256 {got['sha256']} instead of {manifest['sha256']}")
        if got["archive_bytes"] != manifest["archive_bytes"]:
            problems.append(f"{got['archive_bytes']} archive bytes instead of {manifest['archive_bytes']}")
        if (got["files"], got["bytes"]) != (manifest["files"], manifest["bytes"]):
            problems.append(
                f"{got['files']} files / {got['bytes']} bytes instead of {manifest['files']} / {manifest['bytes']}"
            )
        if problems:
            raise KernelError(
                f"the archive {store.describe(key)}{ARCHIVE_NAME} does not match its manifest ({'; '.join(problems)}); "
                "nothing was put in place. Remove the store entry and harvest again"
            )
        _own(staging, DIR_MODE, owner)
        if aside:
            moved = f"{path}{ASIDE_INFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}"
            os.rename(path, moved)
            result["moved_aside"] = moved
        elif state["kind"] == "empty":
            os.rmdir(path)
        os.rename(staging, path)
    except BaseException:
        remove_tree(staging)
        raise
    atomic_write(
        marker_file,
        json_bytes(
            {
                "key": manifest["key"],
                "sha256": manifest["sha256"],
                "source": f"store {store.describe(key)}",
                "evidence": manifest.get("evidence"),
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            }
        ),
        owner=owner,
    )
    result.update(sha256=got["sha256"], archive_bytes=got["archive_bytes"], hashed=True)
    return result
