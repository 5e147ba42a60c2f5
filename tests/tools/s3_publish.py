#!/usr/bin/env python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Publish the lab's tiny model (tests/lab/hf_model.py) to an S3 bucket the way the s3 source reads it.

Keys ``<prefix>/<repo_id>/<revision>/<file>`` plus the ``.ttfleet-manifest.json`` of those files, uploaded
with the collection's own client (plugins/module_utils/_net/s3/client.py). Keys are read from files, never argv.

    s3_publish.py --endpoint URL --bucket B --prefix P --repo ORG/NAME --revision SHA \
        --access-key-file F --secret-key-file F2 [--seed N]
Prints ``{"files": {path: {size, sha256}}, "bytes": total}`` of what the s3 source will fetch
(``original/`` excluded, as the role's default ignore pattern does).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, ".ansible", "collections"))

from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import MANIFEST_NAME
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.manifest import build_manifest, identity_of
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sources import s3_prefix_of


def _hf_model():
    spec = importlib.util.spec_from_file_location("hf_model", os.path.join(ROOT, "tests", "lab", "hf_model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("endpoint", "bucket", "prefix", "repo", "revision", "access-key-file", "secret-key-file"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--seed", type=int, default=20261130)
    args = parser.parse_args(argv)
    with open(args.access_key_file) as handle:
        access = handle.read().strip()
    with open(args.secret_key_file) as handle:
        secret = handle.read().strip()
    client = S3Client(args.endpoint, access, secret)
    client.create_bucket(args.bucket)
    contents = _hf_model().model_files(seed=args.seed)
    listing = [
        {"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for rel, data in contents.items()
    ]
    manifest = build_manifest(identity_of("s3", args.repo, args.revision), listing, source="hf")
    base = s3_prefix_of(args.prefix, args.repo, args.revision)
    for rel, data in sorted(contents.items()):
        client.put_object(args.bucket, base + rel, data)
    client.put_object(args.bucket, base + MANIFEST_NAME, json.dumps(manifest).encode())
    fetched = {item["path"]: item for item in listing if not item["path"].startswith("original/")}
    print(json.dumps({"files": fetched, "bytes": sum(item["size"] for item in fetched.values())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
