#!/usr/bin/env python
"""The lab's image origin: a real container registry standing in for ghcr.io (tests and lab only).

LAB ONLY: this tool serves molecule scenarios and benchmarks on this machine. It is no part of the collection and
nothing of it belongs on a real site (plain HTTP, anonymous pushes, a throwaway CA).

    tests/lab/registry.py start --network NET --state DIR --vars-file PATH --image-tar TAR --tag REF [--tag REF ...]
                                [--image-tar TAR --tag REF ...]
    tests/lab/registry.py stop --state DIR [--vars-file PATH]
    tests/lab/registry.py ca --state DIR --name NAME [--name NAME ...]
    tests/lab/registry.py padded-image --from REF --tag REF --mib N --output TAR

start runs Debian's docker-registry (distribution 2.8; the binary is taken out of the package with
``apt-get download`` + ``dpkg-deb -x``, never installed, and cached in .cache/docker-registry) on the gateway of the
lab's Docker network NET (reachable from every lab host, not from outside this machine) on a free port: plain HTTP,
no auth (anonymous pulls and pushes), storage in DIR/storage, log in DIR/registry.log. In front of it runs the
counting proxy (tests/tools/counting_proxy.py), which is what the fleet is given: DIR/origin.jsonl records every
response body it relayed, so tests and benchmarks can tell how many bytes the fleet read from the origin.
Each ``--image-tar`` (a ``docker save`` tarball) is pushed, straight to the registry (not counted), under the
``--tag`` references that follow it: ``ghcr.io/tenstorrent/x/y:1`` becomes repository ``tenstorrent/x/y``, tag
``1``, as a schema 2 manifest whose layers are gzip streams made deterministically (mtime 0, level 1) and cached in
.cache/registry-blobs/<uncompressed sha256>.gz, so a second start compresses nothing. origin.jsonl is emptied
after the push. The vars file (YAML), also printed as JSON on stdout, holds:

    lab_image_origin_registry   "GATEWAY:PROXYPORT", the registry through the counting proxy (give this to the fleet)
    lab_image_origin_direct     "GATEWAY:REGPORT", the registry itself (not counted)
    lab_image_sizes             {REF: {digest: sha256 of the manifest pushed, bytes: compressed layers + config}}

A registry left running by an earlier start on the same DIR is stopped first. stop kills the registry and the
proxy (their process groups) and removes the vars file. ca makes a lab CA (cached in DIR/ca.key, DIR/ca.crt;
EC P-256, 10 years) and, for each NAME, a server certificate signed by it (subjectAltName DNS:NAME, or IP:NAME for
an IPv4 address; serverAuth), printed as JSON {"ca": PEM, "certs": {NAME: {"cert": PEM, "key": PEM}}}.
padded-image builds an image FROM another with one extra layer of N MiB of random bytes (a new image with bytes to
pull) and saves it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gzip
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hf_mirror import free_port, gateway  # tests/lab/hf_mirror.py: the lab network's gateway

CACHE = os.path.join(ROOT, ".cache")
BINARY = os.path.join(CACHE, "docker-registry", "docker-registry")
BLOB_CACHE = os.path.join(CACHE, "registry-blobs")
COUNTING_PROXY = os.path.join(ROOT, "tests", "tools", "counting_proxy.py")
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_MEDIA = "application/vnd.docker.container.image.v1+json"
LAYER_MEDIA = "application/vnd.docker.image.rootfs.diff.tar.gzip"
BLOCK = 1 << 20
TIMEOUT = 60  # seconds without progress on one registry call
# Each process of start: its pid file in DIR and a word its command line must hold before stop signals it.
PROCESSES = {"registry.pid": "docker-registry", "proxy.pid": "counting_proxy.py"}


def log(msg):
    print(f"==> {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def cache_lock(name):
    """Hold .cache/<name>.lock: scenarios run side by side and share the caches."""
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, f"{name}.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _download_deb(tmp, package="docker-registry"):
    """apt-get download ``package`` into ``tmp``; the package lists are refreshed once if that fails (a fresh
    machine may have none) and we may."""
    argv = ["apt-get", "download", "-q", package]
    proc = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, check=False)
    if proc.returncode != 0 and os.geteuid() == 0:
        log(f"apt-get download {package} failed; running apt-get update")
        update = subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True, check=False)
        if update.returncode != 0:
            raise SystemExit(f"apt-get update failed: {update.stderr.strip()}")
        proc = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, check=False)
    debs = [name for name in os.listdir(tmp) if name.endswith(".deb")]
    if proc.returncode != 0 or len(debs) != 1:
        raise SystemExit(f"apt-get download {package} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return os.path.join(tmp, debs[0])


def registry_binary():
    """Debian's docker-registry binary, out of its package (not installed: the package would start a service on
    port 5000), cached in .cache/docker-registry."""
    with cache_lock("docker-registry"):
        if os.access(BINARY, os.X_OK):
            return BINARY
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o755)  # apt-get download as root fetches as _apt, which must write here
            deb = _download_deb(tmp)
            subprocess.run(["dpkg-deb", "-x", deb, os.path.join(tmp, "root")], check=True)
            os.makedirs(os.path.dirname(BINARY), exist_ok=True)
            shutil.copy2(os.path.join(tmp, "root", "usr", "bin", "docker-registry"), BINARY + ".tmp")
            os.replace(BINARY + ".tmp", BINARY)
            log(f"docker-registry from {os.path.basename(deb)} -> {os.path.relpath(BINARY, ROOT)}")
    return BINARY


# -- the image: a docker save tarball as registry blobs ------------------------------------------------------------


def _sha256_stream(source):
    digest = hashlib.sha256()
    for block in iter(lambda: source.read(BLOCK), b""):
        digest.update(block)
    return digest.hexdigest()


def _cached_layer(raw_hex):
    """(path, "sha256:...", size) of the cached gzip of the layer whose uncompressed sha256 is ``raw_hex``, or None.
    The .sha256 file beside it is written last: it marks the entry complete."""
    path = os.path.join(BLOB_CACHE, f"{raw_hex}.gz")
    try:
        with open(path + ".sha256") as handle:
            gz_hex = handle.read().split()[0]
        return path, f"sha256:{gz_hex}", os.path.getsize(path)
    except (FileNotFoundError, IndexError):
        return None


def _compress(source, expected_hex=None):
    """Gzip a layer stream into the cache (deterministic: mtime 0, level 1); its entry (path, digest, size)."""
    os.makedirs(BLOB_CACHE, exist_ok=True)
    tmp = os.path.join(BLOB_CACHE, f".part-{os.getpid()}")
    raw, packed = hashlib.sha256(), hashlib.sha256()

    class Hashing:
        def write(self, data):
            packed.update(data)
            return out.write(data)

        def flush(self):
            out.flush()

    with (
        open(tmp, "wb") as out,
        gzip.GzipFile(filename="", fileobj=Hashing(), mode="wb", compresslevel=1, mtime=0) as gz,
    ):
        for block in iter(lambda: source.read(BLOCK), b""):
            raw.update(block)
            gz.write(block)
    if expected_hex and raw.hexdigest() != expected_hex:
        os.unlink(tmp)
        raise SystemExit(f"a layer of the tarball has sha256 {raw.hexdigest()}, its config says {expected_hex}")
    path = os.path.join(BLOB_CACHE, f"{raw.hexdigest()}.gz")
    os.replace(tmp, path)
    with open(path + ".sha256.tmp", "w") as handle:
        handle.write(f"{packed.hexdigest()}  {os.path.basename(path)}\n")
    os.replace(path + ".sha256.tmp", path + ".sha256")
    return path, f"sha256:{packed.hexdigest()}", os.path.getsize(path)


def image_blobs(tar_path):
    """(config bytes, [(gzip path, digest, size) per layer]) of a docker save tarball. A layer is found in the
    cache by its uncompressed digest (the config's rootfs.diff_ids), so a cached layer is not even read."""
    with tarfile.open(tar_path) as tar:
        entries = json.load(tar.extractfile("manifest.json"))
        if len(entries) != 1:
            raise SystemExit(f"{tar_path}: expected one image in its manifest.json, found {len(entries)}")
        (entry,) = entries
        config = tar.extractfile(entry["Config"]).read()
        diff_ids = json.loads(config).get("rootfs", {}).get("diff_ids") or []
        if len(diff_ids) != len(entry["Layers"]):
            diff_ids = [None] * len(entry["Layers"])
        layers = []
        with cache_lock("registry-blobs"):
            for member, diff_id in zip(entry["Layers"], diff_ids, strict=True):
                raw_hex = diff_id.split(":", 1)[1] if diff_id and diff_id.startswith("sha256:") else None
                if raw_hex is None:  # no usable diff_id: the uncompressed digest has to be read
                    raw_hex = _sha256_stream(tar.extractfile(member))
                cached = _cached_layer(raw_hex)
                if cached is None:
                    started = time.monotonic()
                    cached = _compress(tar.extractfile(member), raw_hex)
                    log(f"gzip {member}: {cached[2]} bytes in {time.monotonic() - started:.1f} s")
                layers.append(cached)
    return config, layers


def split_reference(text):
    """(repository without its registry host, tag) of a full reference ``host/path:tag``."""
    if "@" in text:
        raise SystemExit(f"--tag {text}: a tag is needed, not a digest")
    name, sep, tag = text.rpartition(":")
    if not sep or "/" in tag:
        raise SystemExit(f"--tag {text}: expected HOST/REPOSITORY:TAG")
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        name = rest
    if not re.fullmatch(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*", name):
        raise SystemExit(f"--tag {text}: {name!r} is no repository name")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag):
        raise SystemExit(f"--tag {text}: {tag!r} is no tag")
    return name, tag


# -- a small registry API v2 push client -----------------------------------------------------------------------------


class Pusher:
    """Pushes blobs and manifests to a plain HTTP, anonymous registry at ``address`` (HOST:PORT)."""

    def __init__(self, address):
        self.address = address
        self.base = f"http://{address}"
        self.where = {}  # digest -> a repository that holds it (to mount it into another)

    def call(self, method, url, body=None, headers=None, ok=(200,)):
        """One request; (status, headers, body). ``url`` is a path or an absolute URL of this registry."""
        parts = urllib.parse.urlsplit(urllib.parse.urljoin(self.base + "/", url))
        if parts.netloc != self.address:
            raise SystemExit(f"{method} {url}: the registry sent us to {parts.netloc}, not {self.address}")
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT, blocksize=BLOCK)
        try:
            conn.request(method, target, body=body, headers=headers or {})
            resp = conn.getresponse()
            data = resp.read() if method != "HEAD" else b""
        except (OSError, http.client.HTTPException) as exc:
            raise SystemExit(f"{method} {self.base}{target}: {exc}") from exc
        finally:
            conn.close()
        if resp.status not in ok:
            raise SystemExit(f"{method} {self.base}{target}: HTTP {resp.status} {data[:500].decode(errors='replace')}")
        return resp.status, resp.headers, data

    def has_blob(self, repo, digest):
        status, _headers, _data = self.call("HEAD", f"/v2/{repo}/blobs/{digest}", ok=(200, 404))
        return status == 200

    def push_blob(self, repo, digest, size, open_body):
        """Make blob ``digest`` exist in ``repo``: already there, mounted from another repository, or uploaded
        (POST an upload, PUT its Location with ?digest= and the body); True when bytes were sent."""
        if self.has_blob(repo, digest):
            self.where.setdefault(digest, repo)
            return False
        query = {}
        if self.where.get(digest, repo) != repo:
            query = {"mount": digest, "from": self.where[digest]}
        url = f"/v2/{repo}/blobs/uploads/" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        status, headers, _data = self.call("POST", url, headers={"Content-Length": "0"}, ok=(201, 202))
        if status == 201:  # mounted
            self.where.setdefault(digest, repo)
            return False
        location = headers.get("Location")
        if not location:
            raise SystemExit(f"POST {self.base}{url}: no Location in the answer")
        location += ("&" if "?" in location else "?") + urllib.parse.urlencode({"digest": digest})
        with open_body() as body:
            _status, headers, _data = self.call(
                "PUT",
                location,
                body=body,
                headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
                ok=(201,),
            )
        stored = headers.get("Docker-Content-Digest")
        if stored and stored != digest:
            raise SystemExit(f"{repo}: the registry stored blob {stored}, not {digest}")
        self.where.setdefault(digest, repo)
        return True

    def put_manifest(self, repo, tag, body):
        digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
        _status, headers, _data = self.call(
            "PUT",
            f"/v2/{repo}/manifests/{tag}",
            body=body,
            headers={"Content-Type": MANIFEST_V2, "Content-Length": str(len(body))},
            ok=(201,),
        )
        stored = headers.get("Docker-Content-Digest")
        if stored and stored != digest:
            raise SystemExit(f"{repo}:{tag}: the registry stored manifest {stored}, not {digest}")
        return digest


def push(pusher, tar_path, refs):
    """Push a docker save tarball under ``refs``; {ref: {"digest": manifest digest, "bytes": blob bytes}}."""
    config, layers = image_blobs(tar_path)
    config_digest = f"sha256:{hashlib.sha256(config).hexdigest()}"
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_V2,
            "config": {"mediaType": CONFIG_MEDIA, "size": len(config), "digest": config_digest},
            "layers": [{"mediaType": LAYER_MEDIA, "size": size, "digest": digest} for _path, digest, size in layers],
        },
        indent=3,
    ).encode()
    total = len(config) + sum(size for _path, _digest, size in layers)
    sizes = {}
    for ref in refs:
        repo, tag = split_reference(ref)
        sent = 0
        for path, digest, size in layers:
            if pusher.push_blob(repo, digest, size, lambda path=path: open(path, "rb")):  # noqa: SIM115 - closed by push_blob
                sent += size
        if pusher.push_blob(repo, config_digest, len(config), lambda: contextlib.nullcontext(config)):
            sent += len(config)
        sizes[ref] = {"digest": pusher.put_manifest(repo, tag, manifest), "bytes": total}
        log(f"pushed {repo}:{tag} ({total} bytes, {sent} sent)")
    return sizes


# -- processes ---------------------------------------------------------------------------------------------------


def _ours(pid, word):
    """Whether process ``pid`` is still the one we started (its command line holds ``word``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return word.encode() in handle.read()
    except OSError:
        return False


def _kill_group(pidfile, word):
    """SIGTERM the process group led by the pid in ``pidfile`` (started in its own session), SIGKILL after 5 s."""
    try:
        with open(pidfile) as handle:
            pid = int(handle.read().strip())
    except (FileNotFoundError, ValueError):
        return
    if not _ours(pid, word):
        return
    for sig, wait in ((signal.SIGTERM, 50), (signal.SIGKILL, 20)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        for _attempt in range(wait):
            if not _ours(pid, word):
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)


def stop(state, vars_file=None):
    for name, word in PROCESSES.items():
        _kill_group(os.path.join(state, name), word)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(state, name))
    if vars_file:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(vars_file)


def _spawn(argv, state, pidname, out_name):
    with open(os.path.join(state, out_name), "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
    with open(os.path.join(state, pidname), "w") as handle:
        handle.write(f"{proc.pid}\n")
    return proc


def _wait_v2(address, proc, what, log_path, seconds=20, path="/v2/"):
    """Wait until GET http://address``path`` answers 200, at most ``seconds``."""
    host, _sep, port = address.rpartition(":")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}; see {log_path}")
        conn = http.client.HTTPConnection(host, int(port), timeout=2)
        try:
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.1)
    raise SystemExit(f"{what} did not answer GET http://{address}{path} with 200 within {seconds} s; see {log_path}")


def _registry_config(state, address):
    storage = os.path.join(state, "storage")
    path = os.path.join(state, "registry.yml")
    with open(path, "w") as handle:
        handle.write(
            "# Written by tests/lab/registry.py start (lab only): plain HTTP, anonymous pulls and pushes.\n"
            "version: 0.1\n"
            "log:\n  level: info\n  formatter: text\n  accesslog:\n    disabled: false\n"
            f"storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: false\n"
            "  cache:\n    blobdescriptor: inmemory\n"
            f"http:\n  addr: {address}\n  headers:\n    X-Content-Type-Options: [nosniff]\n"
        )
    return path, storage


def _start_proxy(state, host, upstream):
    origin_log = os.path.join(state, "origin.jsonl")
    open(origin_log, "w").close()
    out_path = os.path.join(state, "proxy.out")
    open(out_path, "w").close()
    argv = [sys.executable, COUNTING_PROXY, "--listen", f"{host}:0", "--upstream", f"http://{upstream}"]
    # --keep-host: URLs the registry builds from the Host header then name the proxy, which the client talks to.
    argv += ["--log", origin_log, "--pidfile", os.path.join(state, "proxy.pid"), "--keep-host"]
    proc = _spawn(argv, state, "proxy.pid", "proxy.out")
    endpoint = ""
    for _attempt in range(100):
        with open(out_path) as handle:
            endpoint = handle.readline().strip()
        if endpoint or proc.poll() is not None:
            break
        time.sleep(0.1)
    if not endpoint.startswith("http://"):
        raise SystemExit(f"the counting proxy did not start; see {out_path}")
    address = endpoint[len("http://") :]
    _wait_v2(address, proc, "the counting proxy", out_path)
    return address, origin_log


def _write_vars(path, result):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    lines = ["---", "# Written by tests/lab/registry.py start (lab only)."]
    for key in ("lab_image_origin_registry", "lab_image_origin_direct"):
        lines.append(f"{key}: {json.dumps(result[key])}")
    lines.append("lab_image_sizes:" + ("" if result["lab_image_sizes"] else " {}"))
    for ref, size in result["lab_image_sizes"].items():
        lines.append(f"  {json.dumps(ref)}: {{digest: {json.dumps(size['digest'])}, bytes: {size['bytes']}}}")
    with open(path + ".tmp", "w") as handle:
        handle.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)


def start(args):
    if len(args.tags) != len(args.image_tar) or not all(args.tags):
        raise SystemExit("give each --image-tar at least one --tag after it")
    for tar_path, refs in zip(args.image_tar, args.tags, strict=True):
        if not os.path.isfile(tar_path):
            raise SystemExit(f"--image-tar {tar_path}: no such file")
        for ref in refs:
            split_reference(ref)
    stop(args.state, args.vars_file)
    os.makedirs(args.state, exist_ok=True)
    started = time.monotonic()
    binary = registry_binary()
    try:
        host = gateway(args.network)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"docker network inspect {args.network} failed: {exc.stderr.strip()}") from exc
    address = f"{host}:{free_port(host)}"
    config, storage = _registry_config(args.state, address)
    shutil.rmtree(storage, ignore_errors=True)  # the origin holds exactly what this start pushes
    log_path = os.path.join(args.state, "registry.log")
    proc = _spawn([binary, "serve", config], args.state, "registry.pid", "registry.log")
    _wait_v2(address, proc, "docker-registry", log_path)
    proxy, origin_log = _start_proxy(args.state, host, address)
    pusher = Pusher(address)
    sizes = {}
    for tar_path, refs in zip(args.image_tar, args.tags, strict=True):
        sizes.update(push(pusher, tar_path, refs))
    open(origin_log, "w").close()  # only what the fleet reads from now on counts
    result = {"lab_image_origin_registry": proxy, "lab_image_origin_direct": address, "lab_image_sizes": sizes}
    _write_vars(args.vars_file, result)
    log(f"origin {proxy} (registry {address}) ready in {time.monotonic() - started:.1f} s; vars {args.vars_file}")
    print(json.dumps(result))


# -- the lab CA ----------------------------------------------------------------------------------------------------


def _openssl(*argv):
    proc = subprocess.run(["openssl", *argv], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"openssl {argv[0]} failed: {proc.stderr.strip()}")


EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def ca(args):
    for name in args.name:
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", name):
            raise SystemExit(f"--name {name!r}: expected a DNS name or an IPv4 address")
    os.makedirs(args.state, exist_ok=True)
    ca_key, ca_crt = os.path.join(args.state, "ca.key"), os.path.join(args.state, "ca.crt")
    old_umask = os.umask(0o077)  # keys are born 0600
    try:
        with cache_lock("registry-ca"):
            if not (os.path.exists(ca_crt) and os.path.exists(ca_key)):
                _openssl(
                    "req", "-x509", *EC_KEY, "-keyout", ca_key, "-out", ca_crt, "-days", "3650",
                    "-subj", "/CN=ttfleet lab CA (tests only)",
                    "-addext", "basicConstraints=critical,CA:TRUE",
                    "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                )  # fmt: skip
        certs = {}
        for name in args.name:
            key, csr, crt, ext = (
                os.path.join(args.state, f"{name}.{suffix}") for suffix in ("key", "csr", "crt", "ext")
            )
            with open(ext, "w") as handle:
                kind = "IP" if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name) else "DNS"
                handle.write(
                    f"subjectAltName={kind}:{name}\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n"
                    "keyUsage=critical,digitalSignature\nauthorityKeyIdentifier=keyid,issuer\n"
                )
            _openssl("req", *EC_KEY, "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
            _openssl(
                "x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-set_serial",
                str(int.from_bytes(os.urandom(15), "big")), "-out", crt, "-days", "3650", "-extfile", ext,
            )  # fmt: skip
            for path, mode in ((key, 0o600), (ca_key, 0o600), (crt, 0o644), (ca_crt, 0o644)):
                os.chmod(path, mode)
            with open(crt) as cert_handle, open(key) as key_handle:
                certs[name] = {"cert": cert_handle.read(), "key": key_handle.read()}
    finally:
        os.umask(old_umask)
    with open(ca_crt) as handle:
        print(json.dumps({"ca": handle.read(), "certs": certs}))


# -- a second image --------------------------------------------------------------------------------------------------


def padded_image(args):
    inspect = ["docker", "image", "inspect", "--format", "{{json .Config.User}}", args.source]
    proc = subprocess.run(inspect, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"docker image inspect {args.source} failed: {proc.stderr.strip()}")
    user = json.loads(proc.stdout) or "0"
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "Dockerfile"), "w") as handle:
            # LAB STAND-IN (tests only): the given image plus a layer of random bytes, written as root (the stand-in
            # runs as user 1000), then the image's own user again.
            handle.write(
                f"FROM {args.source}\nUSER 0\nRUN head -c {args.mib}M /dev/urandom > /lab-padding\nUSER {user}\n"
            )
        proc = subprocess.run(
            ["docker", "build", "-q", "-t", args.tag, tmp], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise SystemExit(f"docker build of {args.tag} failed: {proc.stderr.strip()}")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    subprocess.run(["docker", "save", "--output", args.output + ".tmp", args.tag], check=True)
    os.replace(args.output + ".tmp", args.output)
    print(args.output)


class _TagsAction(argparse.Action):
    """--tag values group under the --image-tar before them."""

    def __call__(self, parser, namespace, values, option_string=None):
        if not namespace.image_tar:
            parser.error("--tag must follow an --image-tar")
        while len(namespace.tags) < len(namespace.image_tar):
            namespace.tags.append([])
        namespace.tags[len(namespace.image_tar) - 1].append(values)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("start", help="start the origin registry and push images into it")
    cmd.add_argument("--network", default="ttfleet-lab")
    cmd.add_argument("--state", required=True)
    cmd.add_argument("--vars-file", required=True)
    cmd.add_argument("--image-tar", action="append", default=[], required=True)
    cmd.add_argument("--tag", dest="tags", action=_TagsAction, default=[])
    cmd = sub.add_parser("stop", help="stop the registry and its counting proxy")
    cmd.add_argument("--state", required=True)
    cmd.add_argument("--vars-file")
    cmd = sub.add_parser("ca", help="a lab CA and server certificates signed by it, as JSON")
    cmd.add_argument("--state", required=True)
    cmd.add_argument("--name", action="append", required=True)
    cmd = sub.add_parser("padded-image", help="an image FROM another plus N MiB of random bytes, saved")
    cmd.add_argument("--from", dest="source", required=True)
    cmd.add_argument("--tag", required=True)
    cmd.add_argument("--mib", type=int, default=64)
    cmd.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    args.state = os.path.abspath(args.state) if getattr(args, "state", None) else None
    if args.command == "start":
        args.image_tar = [os.path.abspath(path) for path in args.image_tar]
        start(args)
    elif args.command == "stop":
        stop(args.state, args.vars_file)
    elif args.command == "ca":
        ca(args)
    else:
        padded_image(args)


if __name__ == "__main__":
    main()
