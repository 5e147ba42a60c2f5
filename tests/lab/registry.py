#!/usr/bin/env python
"""The lab's image origin: a real container registry standing in for ghcr.io (tests and lab only).

    tests/lab/registry.py start --network NET --state DIR --vars-file PATH (--image-tar TAR --tag REF ...) ...
    tests/lab/registry.py padded-image --from REF --tag REF --mib N --output TAR
    tests/lab/registry.py ca --state DIR --name NAME [--name NAME ...]
    tests/lab/registry.py stop --state DIR [--vars-file PATH]

start runs Debian's docker-registry (distribution 2.8, its binary taken from the package without installing it:
``apt-get download`` + ``dpkg-deb -x``, cached in .cache/docker-registry) on the gateway of the lab's Docker network,
plain HTTP and anonymous, with tests/tools/counting_proxy.py in front of it: ``<state>/origin.jsonl`` records every
body the fleet read from the origin. Each ``--image-tar`` (a ``docker save`` tarball) is pushed under the ``--tag``
references that follow it, each without its registry host (``ghcr.io/tenstorrent/x:1`` becomes ``tenstorrent/x:1``),
as a schema 2 manifest with gzip layers (compressed once, cached in .cache/registry-blobs), through the collection's
own registry client (plugins/module_utils/_images.py). The vars file gets ``lab_image_origin_registry`` (the counting
proxy), ``lab_image_origin_direct`` and ``lab_image_sizes`` (reference -> manifest digest and bytes of its blobs).

padded-image builds an image FROM another with one layer of N MiB of random bytes (a new image with bytes to pull)
and saves it. ca makes a lab CA (cached in the state directory) and a server certificate per name, printed as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, ".ansible", "collections"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hf_mirror import _kill, free_port, gateway

from ansible_collections.ttfleet.inference.plugins.module_utils import _images

BINARY_DIR = os.path.join(ROOT, ".cache", "docker-registry")
BLOB_CACHE = os.path.join(ROOT, ".cache", "registry-blobs")
COUNTING_PROXY = os.path.join(ROOT, "tests", "tools", "counting_proxy.py")
CONFIG_MEDIA = "application/vnd.docker.container.image.v1+json"
LAYER_MEDIA = "application/vnd.docker.image.rootfs.diff.tar.gzip"


def log(msg):
    print(f"==> {msg}", file=sys.stderr, flush=True)


def binary():
    """Debian's docker-registry binary, from its package, not installed."""
    path = os.path.join(BINARY_DIR, "docker-registry")
    if os.path.exists(path):
        return path
    with tempfile.TemporaryDirectory() as tmp:
        download = ["apt-get", "download", "docker-registry"]
        proc = subprocess.run(download, cwd=tmp, capture_output=True, text=True, check=False)
        if proc.returncode != 0 and os.geteuid() == 0:
            subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True)
            proc = subprocess.run(download, cwd=tmp, capture_output=True, text=True, check=False)
        debs = [name for name in os.listdir(tmp) if name.endswith(".deb")]
        if proc.returncode != 0 or not debs:
            raise SystemExit(f"apt-get download docker-registry failed: {proc.stderr.strip()}")
        subprocess.run(["dpkg-deb", "-x", os.path.join(tmp, debs[0]), os.path.join(tmp, "x")], check=True)
        os.makedirs(BINARY_DIR, exist_ok=True)
        shutil.copy2(os.path.join(tmp, "x", "usr", "bin", "docker-registry"), path + ".tmp")
        os.replace(path + ".tmp", path)
    log(f"docker-registry from {debs[0]} -> {os.path.relpath(path, ROOT)}")
    return path


def _blobs_of(tar_path):
    """(config bytes, [(gzip path, digest, size)]) of a docker save tarball; gzip layers cached by content."""
    os.makedirs(BLOB_CACHE, exist_ok=True)
    with tarfile.open(tar_path) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))[0]
        config = tar.extractfile(manifest["Config"]).read()
        layers = []
        for member in manifest["Layers"]:
            source = tar.extractfile(member)
            raw = hashlib.sha256()
            tmp = os.path.join(BLOB_CACHE, f".part-{os.getpid()}")
            # Compressed to a temporary file first: the cache key is the uncompressed digest, known at the end.
            with open(tmp, "wb") as out, gzip.GzipFile(fileobj=out, mode="wb", compresslevel=1, mtime=0) as gz:
                while chunk := source.read(1 << 20):
                    raw.update(chunk)
                    gz.write(chunk)
            cached = os.path.join(BLOB_CACHE, raw.hexdigest() + ".gz")
            if os.path.exists(cached):
                os.unlink(tmp)
            else:
                os.replace(tmp, cached)
            digest = hashlib.sha256()
            with open(cached, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
            layers.append((cached, "sha256:" + digest.hexdigest(), os.path.getsize(cached)))
    return config, layers


def push(address, tar_path, refs):
    """Push a docker save tarball to the registry at ``address`` under ``refs``; returns {ref: {digest, bytes}}."""
    config, layers = _blobs_of(tar_path)
    client = _images.Registry(address, None, plain_http=True)
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": _images.MANIFEST_V2,
            "config": {"mediaType": CONFIG_MEDIA, "size": len(config), "digest": config_digest},
            "layers": [{"mediaType": LAYER_MEDIA, "size": size, "digest": digest} for _path, digest, size in layers],
        },
        indent=3,
    ).encode()
    sizes = {}
    for ref_text in refs:
        ref = _images.parse_reference(ref_text)
        path = ref.path
        if not client.has_blob(path, config_digest):
            client.upload_blob(path, config_digest, len(config), _Bytes(config))
        for blob_path, digest, size in layers:
            if not client.has_blob(path, digest):
                with open(blob_path, "rb") as handle:
                    client.upload_blob(path, digest, size, handle)
        pushed = client.put_manifest(path, ref.tag, manifest, _images.MANIFEST_V2)
        digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        if pushed and pushed != digest:
            raise SystemExit(f"{ref_text}: the registry stored {pushed}, not {digest}")
        sizes[ref_text] = {"digest": digest, "bytes": len(config) + sum(size for _p, _d, size in layers)}
        log(f"pushed {ref_text} as {path}:{ref.tag} ({sizes[ref_text]['bytes']} bytes)")
    return sizes


class _Bytes:
    def __init__(self, data):
        self.data, self.at = data, 0

    def read(self, amount):
        chunk = self.data[self.at : self.at + amount]
        self.at += len(chunk)
        return chunk


def _wait_for(url, proc, what, log_path):
    for _attempt in range(200):
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                return
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}; see {log_path}")
        time.sleep(0.1)
    raise SystemExit(f"{what} did not answer {url} within 20 s; see {log_path}")


def start(args):
    stop(args.state, args.vars_file)
    if len(args.image_tar) != len(args.tags):
        raise SystemExit("give each --image-tar its --tag references after it")
    os.makedirs(args.state, exist_ok=True)
    host = gateway(args.network)
    port = free_port(host)
    storage = os.path.join(args.state, "storage")
    shutil.rmtree(storage, ignore_errors=True)
    config = os.path.join(args.state, "registry.yml")
    with open(config, "w") as handle:
        handle.write(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {storage}\n  delete:\n    enabled: false\nhttp:\n  addr: {host}:{port}\n"
        )
    log_path = os.path.join(args.state, "registry.log")
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            [binary(), "serve", config], stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True
        )
    with open(os.path.join(args.state, "registry.pid"), "w") as handle:
        handle.write(f"{proc.pid}\n")
    _wait_for(f"http://{host}:{port}/v2/", proc, "docker-registry", log_path)
    sizes = {}
    for tar_path, refs in zip(args.image_tar, args.tags, strict=True):
        sizes.update(push(f"{host}:{port}", tar_path, refs))
    origin_log = os.path.join(args.state, "origin.jsonl")
    open(origin_log, "w").close()
    with open(os.path.join(args.state, "proxy.out"), "wb") as out:
        proxy = subprocess.Popen(
            [
                sys.executable,
                COUNTING_PROXY,
                "--listen",
                f"{host}:0",
                "--upstream",
                f"http://{host}:{port}",
                "--log",
                origin_log,
                "--pidfile",
                os.path.join(args.state, "proxy.pid"),
                "--keep-host",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    endpoint = ""
    for _attempt in range(100):
        with open(os.path.join(args.state, "proxy.out")) as handle:
            endpoint = handle.readline().strip()
        if endpoint or proxy.poll() is not None:
            break
        time.sleep(0.1)
    if not endpoint.startswith("http://"):
        raise SystemExit(f"the counting proxy did not start; see {args.state}/proxy.out")
    origin = endpoint[len("http://") :].rstrip("/")
    result = {
        "lab_image_origin_registry": origin,
        "lab_image_origin_direct": f"{host}:{port}",
        "lab_image_sizes": sizes,
    }
    os.makedirs(os.path.dirname(args.vars_file), exist_ok=True)
    with open(args.vars_file, "w") as handle:
        handle.write("---\n# Written by tests/lab/registry.py start (lab only, not committed).\n")
        handle.write(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


def stop(state, vars_file=None):
    for name in ("registry.pid", "proxy.pid"):
        _kill(os.path.join(state, name))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(state, name))
    if vars_file:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(vars_file)


def padded_image(args):
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "Dockerfile"), "w") as handle:
            # LAB STAND-IN (tests only): the stand-in image plus a layer of random bytes.
            handle.write(f"FROM {args.source}\nRUN head -c {args.mib}M /dev/urandom > /lab-padding\n")
        subprocess.run(["docker", "build", "-q", "-t", args.tag, tmp], check=True, capture_output=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    subprocess.run(["docker", "save", "--output", args.output + ".tmp", args.tag], check=True)
    os.replace(args.output + ".tmp", args.output)
    print(args.output)


def _openssl(*argv):
    subprocess.run(["openssl", *argv], check=True, capture_output=True)


def ca(args):
    os.makedirs(args.state, exist_ok=True)
    ca_key, ca_crt = os.path.join(args.state, "ca.key"), os.path.join(args.state, "ca.crt")
    if not os.path.exists(ca_crt):
        _openssl(
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            ca_key,
            "-out",
            ca_crt,
            "-days",
            "3650",
            "-subj",
            "/CN=ttfleet lab CA",
        )
        os.chmod(ca_key, 0o600)
    certs = {}
    for name in args.name:
        key, csr, crt = (os.path.join(args.state, f"{name}.{ext}") for ext in ("key", "csr", "crt"))
        ext = os.path.join(args.state, f"{name}.ext")
        with open(ext, "w") as handle:
            handle.write(f"subjectAltName=DNS:{name}\nextendedKeyUsage=serverAuth\n")
        _openssl(
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            key,
            "-out",
            csr,
            "-subj",
            f"/CN={name}",
        )
        os.chmod(key, 0o600)
        _openssl(
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca_crt,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-out",
            crt,
            "-days",
            "3650",
            "-extfile",
            ext,
        )
        with open(crt) as c, open(key) as k:
            certs[name] = {"cert": c.read(), "key": k.read()}
    with open(ca_crt) as handle:
        print(json.dumps({"ca": handle.read(), "certs": certs}))


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
    cmd = sub.add_parser("start")
    cmd.add_argument("--network", default="ttfleet-lab")
    cmd.add_argument("--state", required=True)
    cmd.add_argument("--vars-file", required=True)
    cmd.add_argument("--image-tar", action="append", default=[])
    cmd.add_argument("--tag", dest="tags", action=_TagsAction, default=[])
    cmd = sub.add_parser("stop")
    cmd.add_argument("--state", required=True)
    cmd.add_argument("--vars-file")
    cmd = sub.add_parser("padded-image")
    cmd.add_argument("--from", dest="source", required=True)
    cmd.add_argument("--tag", required=True)
    cmd.add_argument("--mib", type=int, default=64)
    cmd.add_argument("--output", required=True)
    cmd = sub.add_parser("ca")
    cmd.add_argument("--state", required=True)
    cmd.add_argument("--name", action="append", required=True)
    args = parser.parse_args(argv)
    if getattr(args, "state", None):
        args.state = os.path.abspath(args.state)
    {"start": start, "stop": lambda a: stop(a.state, a.vars_file), "padded-image": padded_image, "ca": ca}[
        args.command
    ](args)


if __name__ == "__main__":
    main()
