#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: model_weights
short_description: Fetch, verify and record model weights in a tt-inference-server volume
version_added: 0.1.0
description:
  - Makes O(dest) (normally C(<volume>/weights/<model_name>)) hold the files of a model as a plain
    C(--local-dir) layout (real files, no Hugging Face cache symlinks), which is what tt-inference-server mounts.
  - "Sources: V(hf) speaks the Hugging Face Hub HTTP protocol itself (no huggingface_hub needed on the host) against
    O(hf_endpoint), for example huggingface.co or a mirror such as olah; V(path) takes the files from a local or NFS
    directory, hardlinking them when it is on the filesystem of O(dest) and copying them otherwise."
  - Files are fetched into C(<parent of dest>/.ttfleet-staging/<name of dest>/) on the same filesystem, checked
    against the digests of the source while they stream, and renamed into O(dest) only when every planned file is
    complete, so a half-downloaded model is never in place. An interrupted run leaves its partial files there and
    the next run resumes them (with an HTTP C(Range) request; a server that ignores it makes that one file start
    over) without fetching finished files again.
  - A manifest C(.ttfleet-manifest.json) in O(dest) records the source, repository, resolved commit and the size
    and sha256 of every file. With O(verify=auto) a run whose manifest matches the source only compares sizes, so a
    converged host never re-hashes its weights; otherwise every file in place is hashed (in parallel) and a missing,
    truncated or corrupt file is fetched again on its own.
  - Files in O(dest) that are not part of the source (after the patterns) are reported in RV(plan.extra) and
    never touched.
  - Before writing anything, the free space of the filesystem of O(dest) must cover the bytes still to fetch plus
    O(disk_margin_gb); otherwise the module fails naming the host, the path, the space needed and the space free.
  - "Ownership: the weights belong to O(owner) (root by default) and are read-only to everyone else: directories
    C(0755), files C(0644) (C(0755) when they have an execute bit). The serving container only reads them. With
    O(container_owner) set, O(dest) must be C(<volume>/weights/<model>) and the volume gets its layout too: the
    volume and its C(weights) directory belong to O(owner) with mode C(0755), and C(tt_metal_cache), C(logs),
    C(model_file_symlinks_map) and C(huggingface), which the server writes, are created when missing and belong to
    O(container_owner) (their contents are left alone)."
  - A volume whose weights an older release of this collection or the factory gave to the container user is
    re-owned once its weights are complete and verified, on descriptors and without following a link; links and
    special files inside O(dest) are left alone and reported as warnings. The next run reports no change.
  - Nothing in O(dest), its staging directory or a O(path) source is followed when it is a link or opened when it
    is a special file (FIFO, device, socket); a link planted in place of O(dest) or of a directory inside it is
    refused. Staging is root's own (mode C(0700)); a staging directory that is not is removed and started anew.
extends_documentation_fragment:
  - ttfleet.inference.proxy
  - ttfleet.inference.attributes
  - ttfleet.inference.weights_source
attributes:
  check_mode:
    support: full
    details:
      - Lists the source and compares it with O(dest) (hashing files when O(verify) asks for it) and writes nothing,
        not even the staging directory. Owners and modes to fix and the volume layout to apply count as changes.
  diff_mode:
    support: full
    details:
      - The diff summarises O(dest) before and after (files complete, missing, corrupt, bytes to move, owners and
        modes to fix, the volume layout, and the source used). It never shows the token.
  idempotent:
    support: full
options:
  dest:
    description:
      - Absolute path of the weights directory, normally C(<volume>/weights/<model_name>). Created when missing
        (with its missing parents), owned by O(owner) and O(group), mode C(0755).
      - A link in place of O(dest) (or of one of its parents) that a non-root user could have planted is refused.
      - Its parent directory also holds the staging directory, so both are on one filesystem.
    type: path
    required: true
  source:
    description:
      - Where the files come from. V(hf) is a Hugging Face Hub (or mirror) at O(hf_endpoint), V(path) a directory
        on the host given by O(path).
      - V(s3) is an S3-compatible bucket holding the weights directory in the C(--local-dir) layout under the keys
        C(<s3_prefix>/<repo_id>/<revision>/<file>), with the C(.ttfleet-manifest.json) this module writes beside the
        files (upload a weights directory that this module filled, manifest included); each file is checked against
        the manifest's sha256.
      - V(peer) is another fleet host holding the same O(repo_id) at the same O(revision), served by
        M(ttfleet.inference.weights_server) at O(peer_url); files are checked against the peer's manifest, which must
        have the digest O(expected_manifest_sha256) fixed from the origin.
      - V(none) fetches and records nothing; the weights already in O(dest) (a preseeded or aliased volume, which
        must exist) only get their owner, modes and, with O(container_owner), the volume layout.
    type: str
    choices: [hf, path, s3, peer, none]
    default: hf
  repo_id:
    description:
      - The Hugging Face repository, for example V(Qwen/Qwen3-32B). Required when O(source=hf); recorded in the
        manifest for O(source=path).
    type: str
  revision:
    description:
      - The commit of O(repo_id) to fetch, a full 40-character SHA.
      - A branch, tag or abbreviated SHA is refused unless O(allow_floating_revision=true); it is then resolved to
        its commit SHA, which is fetched and recorded.
    type: str
  path:
    description:
      - The directory holding the model files when O(source=path), for example an NFS share or another volume.
        The top-level C(.cache) and C(.git) directories are skipped.
      - Only regular files are taken. A link or special file among the files kept by the patterns is refused,
        naming it (a Hugging Face cache snapshot, whose files are links, must be copied out first, for example with
        C(huggingface-cli download --local-dir)), because a link placed by whoever can write the source could
        otherwise make a root-only file readable in the weights.
    type: path
  allow_patterns:
    description:
      - Only files whose path matches one of these shell patterns are fetched (C(*) also matches C(/); a pattern
        ending in C(/) means everything below). All files when not set.
    type: list
    elements: str
  workers:
    description:
      - Files hashed in parallel. Defaults to the number of CPUs, at most 8.
    type: int
  owner:
    description:
      - UID that owns O(dest) and everything in it. Files get mode C(0644) (C(0755) with an execute bit),
        directories C(0755); files and directories of a model already in place are corrected (links and special
        files are left alone).
      - Keep the default, root, so that the serving container (UID 1000) can read the weights but not change them.
      - A file of O(path) is hardlinked (same filesystem) only when it already has this owner and the mode above,
        since the link shares its inode with the source; any other file is copied, and the copy never takes the
        source's owner or mode.
    type: int
    default: 0
  group:
    description:
      - GID of O(dest) and everything in it.
    type: int
    default: 0
  status_file:
    description:
      - While bytes move, a JSON file rewritten atomically about every 2 seconds with C(state), C(done_bytes),
        C(total_bytes), C(rate) (bytes per second), C(eta) (seconds), C(file) and C(updated_at), for a progress
        reporter to poll.
    type: path
  peer_url:
    description: The RV(ttfleet.inference.weights_server#module:url) of the peer serving the model, for O(source=peer).
    type: str
  peer_fallback_urls:
    version_added: 0.2.0
    description:
      - More holders of the same O(repo_id) at the same O(revision), for O(source=peer), asked in this order when
        the peer at O(peer_url) fails (stopped, died mid-file, sent a wrong byte) or is not given.
      - The next holder is asked only for what is still missing; a file cut in the middle resumes with a C(Range)
        request at the byte where the last one stopped. A resumed file that fails its digest is fetched again from
        byte 0 at the same holder before that holder is failed over, so a holder is only blamed for bytes it sent
        itself (not for the bytes of one that lied and died before it).
      - When every holder failed, the module fails with one line per holder and keeps what arrived in full for the
        next attempt (from another source, the origin for example).
    type: list
    elements: str
    default: []
  expected_manifest_sha256:
    version_added: 0.2.0
    description:
      - For O(source=peer) or O(source=s3), the RV(manifest_sha256) that this module returned on a host that read the
        origin (the Hub, bucket or directory) for the same O(repo_id) at the same O(revision). The holder's manifest
        (after the patterns) must have this digest, or nothing is taken from that holder and the next one is asked;
        the sha256 of each file then comes from a manifest the origin fixed, not from the holder.
      - The model_cache role fixes it from the hosts that read the origin before the fan-out starts and passes it to
        every pull. Without it a holder's own manifest is all a pull checks against, and a holder (or anything on
        the plain-HTTP path to it) that rewrites the files and the manifest together is believed.
    type: str
  serve:
    version_added: 0.3.0
    description:
      - Once the weights in O(dest) are complete and verified, serve them to fleet peers as
        M(ttfleet.inference.weights_server) does with O(ttfleet.inference.weights_server#module:state=started) (the
        same server, its state under the same O(serve.run_dir)), and return its RV(server). A server already running
        under O(serve.name) for the same files, O(serve.bind), and with half of O(serve.ttl) left, is kept.
      - One module run that pulls and then serves, instead of two; the model_cache role's fan-out passes it to every
        pull whose host serves in a later round. When the fetch fails, nothing is served.
      - Stop the server with M(ttfleet.inference.weights_server)
        O(ttfleet.inference.weights_server#module:state=stopped).
    type: dict
    suboptions:
      name:
        version_added: 0.3.0
        description: Name of the server's state file, as O(ttfleet.inference.weights_server#module:name).
        type: str
        required: true
      bind:
        version_added: 0.3.0
        description: The address to listen on; when not set, the address of the interface of the default route.
        type: str
      port:
        version_added: 0.3.0
        description: TCP port; V(0) picks a free one.
        type: int
        default: 0
      ttl:
        version_added: 0.3.0
        description: Seconds after which the server stops on its own.
        type: int
        default: 3600
      run_dir:
        version_added: 0.3.0
        description: Directory of the server's state files, as O(ttfleet.inference.weights_server#module:run_dir).
        type: path
        default: /run/ttfleet-weights
notes:
  - Sizes in messages are binary units (GiB), as tt-inference-server counts disk.
  - The manifest records where the files came from; it holds no secret.
seealso:
  - module: ttfleet.inference.volume_facts
    description: Finds the volume whose C(weights/<model_name>) this module fills.
  - name: Hugging Face Hub download guide
    description: The --local-dir layout and the endpoints a snapshot uses.
    link: https://huggingface.co/docs/huggingface_hub/guides/download
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
- name: Fetch Qwen3-32B at a pinned commit into its volume
  ttfleet.inference.model_weights:
    dest: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0/weights/Qwen3-32B
    repo_id: Qwen/Qwen3-32B
    revision: 9216db5781bf21249d130ec9da846c4624c16137
    status_file: /run/ttfleet/Qwen3-32B.progress.json

- name: Fetch a gated model from a site mirror
  ttfleet.inference.model_weights:
    dest: /opt/tt-cache/volume_id_tt_transformers-Llama-3.1-8B-Instruct-v0.19.0/weights/Llama-3.1-8B-Instruct
    repo_id: meta-llama/Llama-3.1-8B-Instruct
    revision: 0e9e39f249a16976918f6564b8830bc894c89659
    hf_endpoint: http://hf-mirror.lab:8090
    hf_token: "{{ vault_hf_token }}"
  no_log: true

- name: Get temporary credentials for the weights bucket, once, on the controller
  amazon.aws.sts_assume_role:
    role_arn: arn:aws:iam::123456789012:role/tt-weights-reader
    role_session_name: ttfleet
  delegate_to: localhost
  run_once: true
  register: weights_role
  no_log: true

- name: Fetch Qwen3-32B from an AWS S3 bucket with them (path-style, at the bucket's regional endpoint)
  ttfleet.inference.model_weights:
    dest: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0/weights/Qwen3-32B
    source: s3
    repo_id: Qwen/Qwen3-32B
    revision: 9216db5781bf21249d130ec9da846c4624c16137
    s3_endpoint: https://s3.eu-west-1.amazonaws.com
    s3_region: eu-west-1
    s3_bucket: tt-weights
    s3_access_key: "{{ weights_role.sts_creds.access_key }}"
    s3_secret_key: "{{ weights_role.sts_creds.secret_key }}"
    s3_session_token: "{{ weights_role.sts_creds.session_token }}"
  no_log: true

- name: Take the weights from an NFS share (copied, verified, recorded)
  ttfleet.inference.model_weights:
    dest: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0/weights/Qwen3-32B
    source: path
    path: /mnt/models/Qwen3-32B
    repo_id: Qwen/Qwen3-32B

- name: Give a factory volume's weights to root and the kernel cache to the container user
  ttfleet.inference.model_weights:
    dest: /home/tt/data/tt-cache/volume_id_tt_transformers-Qwen3-32B-vqb2_launch/weights/Qwen3-32B
    source: none
    container_owner: 1000

- name: Re-hash everything once, for example after a disk error
  ttfleet.inference.model_weights:
    dest: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0/weights/Qwen3-32B
    repo_id: Qwen/Qwen3-32B
    revision: 9216db5781bf21249d130ec9da846c4624c16137
    verify: sha256
"""

RETURN = r"""
dest:
  description: The weights directory, normalized.
  returned: always
  type: str
  sample: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0/weights/Qwen3-32B
revision:
  description: The commit SHA fetched (O(revision) resolved); V(null) for O(source=path).
  returned: always
  type: str
  sample: 9216db5781bf21249d130ec9da846c4624c16137
plan:
  description: What the source holds and what had to move (or would, in check mode).
  returned: always
  type: dict
  contains:
    source:
      description: The source used, as text (kind, repository, commit and endpoint, or the directory).
      type: str
      sample: hf Qwen/Qwen3-32B@9216db5781bf21249d130ec9da846c4624c16137 from https://huggingface.co
    revision:
      description: Same as RV(revision).
      type: str
    files_total:
      description: Files of the source after the patterns.
      type: int
      sample: 23
    bytes_total:
      description: Their total size.
      type: int
      sample: 65535602688
    to_fetch:
      description: Files that were missing, of the wrong size, corrupt or not regular files, in source order.
      type: list
      elements: str
      sample: [model-00003-of-00017.safetensors]
    bytes_to_fetch:
      description: Bytes still to download or copy (parts already staged by an interrupted run are not counted).
      type: int
    bytes_staged:
      description: Bytes of RV(plan.to_fetch) found already in staging from an interrupted run.
      type: int
    missing:
      description: Files absent from O(dest).
      type: list
      elements: str
    wrong_size:
      description: Files in O(dest) whose size differs from the source.
      type: list
      elements: str
    corrupt:
      description: Files in O(dest) of the right size whose digest differs from the source.
      type: list
      elements: str
    extra:
      description: Files in O(dest) that are not part of the source (at most 50); they are left alone.
      type: list
      elements: str
    attrs:
      description: Directories and files in O(dest) whose owner or mode are (or were) fixed; V(.) is O(dest) itself.
      type: list
      elements: str
    layout:
      description: What the volume layout changes (or would, in check mode), one line each; empty when converged.
      type: list
      elements: str
    complete:
      description: Whether O(dest) held every file intact before the run.
      type: bool
filesystem:
  description: The filesystem O(dest) is on (or will be), as found before anything was written, for a preflight
    across several models.
  returned: always
  type: dict
  contains:
    device:
      description: Device number (C(st_dev)) of the nearest existing directory of O(dest).
      type: int
    free_bytes:
      description: Bytes free there for an unprivileged user.
      type: int
    path:
      description: That directory.
      type: str
bytes_needed:
  description: Bytes the fetch writes to the filesystem of O(dest) (hardlinks and staged parts need none).
  returned: always
  type: int
fetched_bytes:
  description: Bytes downloaded or copied in this run (hardlinks move none).
  returned: always
  type: int
  sample: 3153096
peer:
  description:
    - For O(source=peer), the origin (C(http://host:port), without the server's token) of the holder the files
      came from.
  returned: when O(source=peer)
  type: str
  sample: http://10.0.4.17:41533
peer_failures:
  description:
    - For O(source=peer), one line for each holder that failed before RV(peer) finished, in the order asked.
  returned: when O(source=peer)
  type: list
  elements: str
  sample: []
restarts:
  description:
    - Partial downloads that started over from byte 0, because the server ignored C(Range) or because a resumed file
      failed its digest (the bytes before the resume point came from an earlier attempt, perhaps another holder, so
      the file is fetched whole from the same source before that source is blamed).
  returned: always
  type: int
  sample: 0
hashed:
  description: Files in O(dest) that were hashed to check them (empty on a converged run with O(verify=auto)).
  returned: always
  type: list
  elements: str
verified:
  description: How files already in O(dest) were checked, V(sha256) or V(size).
  returned: always
  type: str
  sample: size
manifest:
  description: Path of the manifest.
  returned: always
  type: str
  sample: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0/weights/Qwen3-32B/.ttfleet-manifest.json
manifest_sha256:
  description:
    - The sha256 of the canonical part of the manifest (repository, revision, and the path, size and sha256 of every
      file, as compact JSON with sorted keys), the same on every host holding the same files. V(null) for
      O(source=path) and O(source=none), and in check mode when a file's digest is not known yet.
    - Pass the value returned by a host that read the origin as O(expected_manifest_sha256) to the peer pulls.
  returned: always
  type: str
  sample: 3d4f0c1b1c6d1c6f0e4cb1f8e0a1b9d39c2c7d5f4f6c0a9b8e7d6c5b4a3f2e1d
server:
  description:
    - With O(serve), the server of O(dest) for fleet peers, as M(ttfleet.inference.weights_server) returns it. The
      URL holds the server's path token, a secret while the server runs; register it without printing it.
  returned: when O(serve) is set and not in check mode
  type: dict
  contains:
    url:
      description: Base URL of the served files (ends in C(/)), for O(peer_url) on the pulling hosts.
      type: str
    port:
      description: The port listened on.
      type: int
    address:
      description: The address listened on.
      type: str
    files:
      description: Number of files served.
      type: int
    pid:
      description: Process id of the server.
      type: int
left_alone:
  description:
    - Links and special files in O(dest) that the ownership layout left alone (also given as warnings).
    - Not named C(skipped), which Ansible reads as the status of the task.
  returned: always
  type: list
  elements: str
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._base.module import fail_on
from ansible_collections.ttfleet.inference.plugins.module_utils._net.proxy import PROXY_OPTIONS, apply_proxy_env
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import mask_url_credentials
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.daemon import ensure_server, server_facts
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import (
    WeightsError,
    scrub,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.options import WEIGHTS_SOURCE_OPTIONS
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sync import sync_weights

URL_OPTIONS = ("hf_endpoint", "s3_endpoint", "peer_url")


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **PROXY_OPTIONS,
            dest=dict(type="path", required=True),
            source=dict(type="str", choices=["hf", "path", "s3", "peer", "none"], default="hf"),
            repo_id=dict(type="str"),
            revision=dict(type="str"),
            path=dict(type="path"),
            allow_patterns=dict(type="list", elements="str"),
            workers=dict(type="int"),
            owner=dict(type="int", default=0),
            group=dict(type="int", default=0),
            status_file=dict(type="path"),
            peer_url=dict(type="str"),
            peer_fallback_urls=dict(type="list", elements="str", default=[]),
            expected_manifest_sha256=dict(type="str"),
            serve=dict(
                type="dict",
                options=dict(
                    name=dict(type="str", required=True),
                    bind=dict(type="str"),
                    port=dict(type="int", default=0),
                    ttl=dict(type="int", default=3600),
                    run_dir=dict(type="path", default="/run/ttfleet-weights"),
                ),
            ),
            **WEIGHTS_SOURCE_OPTIONS,
        ),
        required_if=[
            ("source", "hf", ["repo_id"]),
            ("source", "path", ["path"]),
            ("source", "s3", ["repo_id", "revision", "s3_endpoint", "s3_bucket", "s3_access_key", "s3_secret_key"]),
            ("source", "peer", ["repo_id", "revision"]),
            ("source", "peer", ["peer_url", "peer_fallback_urls"], True),
        ],
        supports_check_mode=True,
    )
    params = module.params
    apply_proxy_env(module)
    secret_values = (params["hf_token"], params["s3_secret_key"], params["s3_session_token"], params["s3_access_key"])
    credentials_error = mask_url_credentials(module, URL_OPTIONS)
    # Any failure, the unforeseen too, ends as its scrubbed text: a traceback would carry request details.
    failed = f"model_weights failed for {params['dest']}"
    with fail_on(module, any_error=failed, redact=lambda text: scrub(text, *secret_values)):
        if credentials_error:
            raise WeightsError(credentials_error)
        if params["disk_margin_gb"] < 0:
            raise WeightsError(f"disk_margin_gb must not be negative, got {params['disk_margin_gb']}")
        if params["workers"] is not None and params["workers"] < 1:
            raise WeightsError(f"workers must be at least 1, got {params['workers']}")
        result = sync_weights(params, check_mode=module.check_mode)
        serve = params["serve"]
        if serve and module.check_mode and not result["plan"]["complete"]:
            # Check mode fetches nothing: a server would start once the files are there.
            result["changed"] = True
        elif serve:
            # The files are complete and verified (sync_weights raised otherwise): they are served as they are now.
            changed, state = ensure_server(
                result["dest"],
                serve["name"],
                bind=serve["bind"],
                port=serve["port"],
                ttl=serve["ttl"],
                run_dir=serve["run_dir"],
                check_mode=module.check_mode,
            )
            result["changed"] = result["changed"] or changed
            if state is not None and not module.check_mode:
                result["server"] = server_facts(state)
        if params["source"] == "peer" and not params["expected_manifest_sha256"]:
            module.warn(
                f"the peer pull of {params['repo_id']}@{params['revision']} trusted the holder's own manifest; pass "
                "expected_manifest_sha256 (the manifest_sha256 of a host that read the origin) to anchor it"
            )

    # "skipped" is Ansible's own key (a true value shows the task as skipped), so the list goes under another name.
    result["left_alone"] = result.pop("skipped")
    for rel in result["left_alone"]:
        module.warn(f"{result['dest']}/{rel} is a link or special file; its owner and mode were left alone")
    diff = result.pop("diff")
    if module._diff:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
