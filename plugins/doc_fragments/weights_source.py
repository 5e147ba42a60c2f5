# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations


class ModuleDocFragment:
    # How model weights are listed and checked at their source: the options that ttfleet.inference.model_weights and
    # ttfleet.inference.model_cache_plan share (one module_defaults group, ttfleet.inference.weights, sets them).
    DOCUMENTATION = r"""
options:
  allow_floating_revision:
    description:
      - Accept a branch or tag name as the revision (V(main) when none is set). Each run then follows it,
        and a moved branch fetches the changed files.
    type: bool
    default: false
  hf_endpoint:
    description:
      - Base URL of the Hub or of a mirror that speaks its protocol.
      - When not set, the E(HF_ENDPOINT) environment variable of the module is used, then V(https://huggingface.co).
    type: str
    default: https://huggingface.co
  hf_token:
    description:
      - Hugging Face access token for gated or private repositories. Requests go out without it first and it is sent
        (as C(Authorization) header, never to another host after a redirect) only once the repository refuses them.
      - When not set, the E(HF_TOKEN) environment variable of the module is used.
      - Never shown in results, errors or diffs.
    type: str
  ignore_patterns:
    description:
      - Files whose path matches one of these patterns are skipped. The default skips Meta's original checkpoints,
        which tt-inference-server does not read.
    type: list
    elements: str
    default: ['original/**']
  verify:
    description:
      - How files already in the weights directory are checked. Fetched files are always checked against the
        source's digests while they stream (sha256 for LFS files, the git blob id for others).
      - V(sha256) hashes every file. A non-LFS file of a Hub repository is checked against its git blob id; its
        sha256 is recorded in the manifest either way.
      - V(size) trusts a manifest entry of the same source with the same size (and the same sha256 for LFS files);
        files the manifest does not cover are hashed.
      - V(auto) is V(size) when the manifest matches the source and V(sha256) otherwise.
    type: str
    choices: [auto, sha256, size]
    default: auto
  disk_margin_gb:
    description:
      - GiB that must stay free on the filesystem of the weights directory on top of the bytes still to fetch.
    type: float
    default: 10
  container_owner:
    description:
      - UID of the serving container (tt-inference-server runs as UID 1000). When set, the weights directory must be
        C(<volume>/weights/<model>) and the volume is laid out for it (see M(ttfleet.inference.model_weights)).
        Unset, only the weights directory is touched.
    type: int
  container_group:
    description:
      - GID of the directories the container writes. Defaults to O(container_owner).
    type: int
  host:
    description:
      - Name of the host in messages. Defaults to the host name.
    type: str
  s3_endpoint:
    description:
      - URL of the S3-compatible service, for example V(https://s3.site.lab:9000) (path-style requests).
      - A URL carrying credentials (C(user:password@host)) is refused; give them as O(s3_access_key) and
        O(s3_secret_key).
    type: str
  s3_bucket:
    description: Bucket holding the models.
    type: str
  s3_prefix:
    description: Key prefix above C(<repo_id>/<revision>/) in O(s3_bucket); empty for none.
    type: str
    default: ""
  s3_region:
    description: Region used in the request signatures (AWS Signature Version 4).
    type: str
    default: us-east-1
  s3_access_key:
    description:
      - Access key id. When not set, the E(AWS_ACCESS_KEY_ID) environment variable of the module is used. Never shown.
    type: str
  s3_secret_key:
    description:
      - Secret access key. When not set, the E(AWS_SECRET_ACCESS_KEY) environment variable of the module is used.
        Never shown in results, errors or diffs.
    type: str
  s3_session_token:
    description:
      - Session token of temporary credentials (AWS STS C(AssumeRole), C(GetSessionToken), SSO), given with the
        O(s3_access_key) and O(s3_secret_key) of the same session. It is sent as the signed
        C(x-amz-security-token) header of every request and never shown in results, errors or diffs.
      - When not set, the E(AWS_SESSION_TOKEN) environment variable of the module is used. Leave both unset with
        long-term keys.
    type: str
  s3_ca_bundle:
    description:
      - PEM file of the CA certificates to trust for an V(https) O(s3_endpoint), on the host. They replace the
        system's CA store for these requests.
    type: path
  s3_verify:
    description: Verify the TLS certificate of O(s3_endpoint). Turn off only in a lab.
    type: bool
    default: true
  timeout:
    description:
      - Seconds an HTTP connection may stay silent before it counts as failed (and is retried, resuming).
    type: int
    default: 60
"""
