#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: kernel_cache
short_description: Harvest a warmed-up kernel cache into a store, or deploy one from it
version_added: 0.1.0
description:
  - Kernel (tensor) caches of tt-inference-server live at C(<volume>/tt_metal_cache/cache_<model_name>/<mesh>) (the
    directory C(run.py) passes as E(TT_CACHE_PATH)). Compiling them takes 20 minutes or more on the first start of a
    model; this module copies a complete one between hosts through a store.
  - A store entry is keyed by O(model_name), O(mesh), O(impl_id), O(tt_metal_commit) and O(vllm_commit) (directory
    C(<store>/<model_name>/<mesh>/<impl_id>/<tt_metal_commit>/<vllm_commit or none>/)) and holds C(kernels.tar.zst),
    its sha256 in C(kernels.tar.zst.sha256) and C(manifest.json) (the key, file count, bytes, sha256, host, evidence
    of the warm-up). The manifest is written last; an entry without one is ignored.
  - O(state=harvested) packs the cache of O(volume) into the store when the store does not hold the key yet. Only a
    B(complete) cache is packed - it exists, holds at least one non-empty file, holds only regular files and
    directories, no in-progress or temporary file (O(temp_patterns)), nothing in it changed during the last
    O(quiet_seconds), nothing changes while it is packed, and there is evidence of a successful warm-up - O(health_url)
    answers HTTP 200, O(warmed=true), or a marker of this module records the same key.
  - O(state=deployed) extracts the store's archive of the key into a staging directory beside the cache (same
    filesystem), checks the sha256 (computed while the archive streams, never in a second pass), the file count and
    bytes against the manifest, and renames it into place. A cache already in place from the same key is left alone
    without reading the archive; a cache in place that no store deployed is left alone unless O(force=true), which
    moves it aside.
  - A marker C(cache_<model_name>/.ttfleet-kernels-<mesh>.json) beside the cache records the key it was deployed or
    harvested with. A cache recorded for another O(tt_metal_commit) is never harvested under this key or deployed
    over without O(force=true), and the message names both commits.
  - O(state=inspected) only reports whether a deploy would change anything (RV(in_place), RV(deployable)); it asks
    no store, so a play can skip the work of preparing a store (a peer packing its cache) on converged hosts.
  - Archives are compressed by the C(zstd) program, which must be installed on the host (package C(zstd)).
extends_documentation_fragment:
  - ttfleet.inference.proxy
  - ttfleet.inference.attributes
attributes:
  check_mode:
    support: full
    details:
      - Checks completeness and the store and reports what would be packed or deployed; writes nothing.
  diff_mode:
    support: full
    details:
      - The diff shows the key of the cache (deployed) or of the store entry (harvested) before and after.
  idempotent:
    support: full
options:
  state:
    description:
      - V(deployed) puts the store's cache of the key at the cache path of O(volume).
      - V(harvested) packs the cache of O(volume) into the store.
      - V(inspected) reports what is at the cache path and changes nothing.
    type: str
    choices: [deployed, harvested, inspected]
    default: deployed
  volume:
    description:
      - Absolute path of the model's volume (the directory mounted as C(cache_root)), for example
        C(/opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0). A symlink to another volume is followed when
        it sits in a directory only root can change (a volume alias in the volume root).
      - Below the volume no link is followed and no special file is opened, for the container user can write
        there; a link at C(tt_metal_cache), C(cache_<model_name>), the cache or the marker is refused with an error
        naming it. A missing volume is made owned by root; C(tt_metal_cache/cache_<model_name>) and the deployed
        cache by O(owner).
    type: path
    required: true
  model_name:
    description: Short model name of the spec, for example V(Qwen3-32B).
    type: str
    required: true
  mesh:
    description:
      - Mesh directory name of the spec (RV(ttfleet.inference.model_spec#module:mesh)), for example V(P300x2).
    type: str
    required: true
  impl_id:
    description: Implementation id of the spec, for example V(tt_transformers).
    type: str
    required: true
  tt_metal_commit:
    description: The C(tt_metal_commit) of the spec. Caches of different commits are never mixed.
    type: str
    required: true
  vllm_commit:
    description: The C(vllm_commit) of the spec; empty for engines without vLLM.
    type: str
  store:
    description:
      - Kind of store. V(path) is a directory on the host (local disk or an NFS share) given by O(store_path);
        V(http) is a read-only store with the same layout under O(store_url) (for example a fleet peer's temporary
        server; deploy only); V(s3) is an S3-compatible bucket (O(s3_endpoint), O(s3_bucket), O(s3_prefix)).
      - Required unless O(state=inspected).
    type: str
    choices: [path, http, s3]
  store_path:
    description: Root directory of a V(path) store. Required when O(store=path).
    type: path
  store_url:
    description:
      - Base URL of an V(http) store, for example the RV(ttfleet.inference.weights_server#module:url) of a peer
        (C(http://<peer>:<port>/<token>/)). Required when O(store=http).
      - Messages, results and the marker show this URL without its path (a peer's path is its access token) and
        without credentials.
    type: str
  store_fallback_urls:
    version_added: 0.2.0
    description:
      - More V(http) stores holding the same entry, asked in turn when the deploy from O(store_url) fails (the
        store does not answer, stalls, stops mid-archive or sends an archive that does not match its manifest).
        A store that fails while the archive streams hands over the rest only, from the byte where it stopped
        (C(Range)), once its C(kernels.tar.zst.sha256) names the same archive; the archive is verified whole. When
        it does not match its manifest, the deploy starts over in a fresh staging directory from the stores not asked
        yet. Nothing is put in place until an archive is verified.
      - A failure after such a splice does not blame the store that sent the rest, which is asked again for the
        whole archive from byte 0 first. When that archive verifies, each part of the failed splice is compared with the
        same bytes of it, and the store whose bytes differed is the one named in RV(store_failures).
      - The fleet fan-out of role model_cache passes the other holders of the round here.
    type: list
    elements: str
    default: []
  http_store_proxy:
    description:
      - Reach the V(http) stores (O(store_url), O(store_fallback_urls)) through the proxy of the host environment
        (C(HTTP_PROXY), C(HTTPS_PROXY), C(NO_PROXY), read as C(ansible.builtin.uri) reads them).
      - Off by default, so these requests go direct - an V(http) store is usually a fleet peer on the site network,
        and the path of its URL is its access token, which a proxy would see. Turn it on for a web server beyond
        the proxy; credentials in such a URL are then refused unless it is C(https) (the request would cross the
        proxy in the clear).
      - An V(s3) store always honours the proxy environment; C(NO_PROXY) keeps one direct.
    type: bool
    default: false
    version_added: 0.2.0
  expected_sha256:
    version_added: 0.2.0
    description:
      - For O(state=deployed), the sha256 of the archive fixed at the origin, as the origin's manifest gives it (the
        fleet fan-out of role model_cache passes the one of the kernel peer's pack result). A store, or any of
        O(store_fallback_urls), whose C(manifest.json) or C(kernels.tar.zst.sha256) names another archive is
        refused, naming it, before its archive is read; the archive is then verified against this sha256 whole.
      - Without it, the store's own manifest is the only anchor, which a store or the network path to it can rewrite
        together with the archive. Set it whenever the store is not the origin itself (a fleet peer, a mirror); a
        deploy from an V(http) store without it warns.
      - Must be 64 lowercase hex digits; an empty value is refused, never read as unset.
    type: str
  keep_store_path:
    version_added: 0.2.0
    description:
      - For O(state=deployed), the root of a V(path) store on this host that keeps the archive, its sha256 and
        its manifest as well, written while the archive streams and committed only once it is verified; the host
        can then serve the entry to others (M(ttfleet.inference.weights_server) with C(kind=kernels)).
      - The archive needs its size free there; the deploy fails first, naming the path, when it is not.
    type: path
  s3_endpoint:
    description:
      - URL of the S3-compatible service of an V(s3) store (path-style requests, AWS Signature Version 4).
      - A URL carrying credentials (C(user:password@host)) is refused; give them as O(s3_access_key) and
        O(s3_secret_key).
    type: str
  s3_bucket:
    description: Bucket of an V(s3) store.
    type: str
  s3_prefix:
    description: Key prefix of the entries in O(s3_bucket).
    type: str
    default: ''
  s3_region:
    description: Region the S3 requests are signed for.
    type: str
    default: us-east-1
  s3_access_key:
    description:
      - S3 access key id. When not set, the E(AWS_ACCESS_KEY_ID) environment variable of the module is used.
    type: str
  s3_secret_key:
    description:
      - S3 secret access key; it only signs requests and is never shown. When not set, the E(AWS_SECRET_ACCESS_KEY)
        environment variable of the module is used.
    type: str
  s3_session_token:
    description:
      - Session token of temporary credentials (AWS STS C(AssumeRole), C(GetSessionToken), SSO), given with the
        O(s3_access_key) and O(s3_secret_key) of the same session. It is sent as the signed
        C(x-amz-security-token) header of every request and never shown.
      - When not set, the E(AWS_SESSION_TOKEN) environment variable of the module is used. Leave both unset with
        long-term keys.
    type: str
  s3_ca_bundle:
    description:
      - PEM file on the host with the CA certificates of an https O(s3_endpoint). They replace the system's CA store
        for these requests.
    type: path
  s3_verify:
    description: Verify the TLS certificate of O(s3_endpoint); turn off only in a lab.
    type: bool
    default: true
  spool:
    description:
      - For O(state=harvested) into an V(s3) store, the directory on the host the archive is packed in before it is
        uploaded (and removed after). Defaults to C(<volume>/tt_metal_cache), the filesystem of the cache. The
        archive gets a random name there and is uploaded from its open descriptor, never by name.
    type: path
  health_url:
    description:
      - For O(state=harvested), a URL of the warmed-up server that must answer HTTP 200, normally
        C(http://127.0.0.1:<port>/health).
    type: str
  warmed:
    description:
      - For O(state=harvested), the operator's word that the server warmed up successfully, instead of O(health_url).
    type: bool
    default: false
  require_marker:
    description:
      - For O(state=harvested), accept only a marker of this module recording the same key as evidence (a cache
        harvested or deployed here before), not O(health_url) or O(warmed). Used to pack a fleet peer's cache.
    type: bool
    default: false
  quiet_seconds:
    description:
      - For O(state=harvested), nothing in the cache may have changed during this many seconds.
    type: int
    default: 120
  temp_patterns:
    description:
      - Shell patterns of file or directory names that mark a cache as being written; a cache holding one is not
        harvested.
    type: list
    elements: str
    default: ['*.tmp', '*.temp', '*.part', '*.partial', '*.incomplete', '*.lock', '*.swp', '*~', '.nfs*',
              '.ttfleet-tmp-*']
  required:
    description:
      - For O(state=deployed), fail when the store holds no entry for the key. Otherwise the module reports the
        reason (naming the commits the store holds instead) with a warning and changes nothing; the server then
        compiles its kernels on first start.
    type: bool
    default: false
  force:
    description:
      - For O(state=deployed), replace a cache in place that no store deployed or that was recorded for another key;
        it is renamed aside (C(<mesh>.ttfleet-aside-<UTC time>)), never deleted.
      - For O(state=harvested), pack again and replace the store entry of the key.
    type: bool
    default: false
  disk_margin_gb:
    description: GiB that must stay free on the volume filesystem beyond the cache being deployed.
    type: float
    default: 1
  level:
    description: zstd compression level for O(state=harvested).
    type: int
    default: 3
  owner:
    description: UID that owns the deployed files and directories (the container user).
    type: int
    default: 1000
  group:
    description: GID of the deployed files and directories.
    type: int
    default: 1000
  status_file:
    description:
      - While a cache is packed or deployed, a JSON file rewritten atomically about every 2 seconds with C(state),
        C(done_bytes), C(total_bytes), C(rate) (bytes per second), C(eta) (seconds), C(file) and C(updated_at), for a
        progress reporter to poll (the action plugin of this module sets one itself).
    type: path
  host:
    description: Name of the host in messages. Defaults to the host name.
    type: str
  timeout:
    description:
      - Seconds a request to the store or the health check may go without receiving a byte (the stall limit).
      - Each request also has an overall limit, whatever the stall limit - 300 seconds for a manifest or checksum
        file, 300 seconds plus one second per MiB of RV(archive_bytes) for the archive, 60 seconds for the health
        check of O(health_url).
      - The archive is read to exactly the manifest's RV(archive_bytes); a longer one is refused before more is
        unpacked. Manifests are read up to 32 MiB. Redirects of an V(http) or V(s3) store are never followed (a
        peer's URL holds its access token; S3 signatures go to O(s3_endpoint) only).
    type: int
    default: 60
notes:
  - Deploying streams the archive once, hashing it on the way; a converged run reads only the small marker and
    manifest.
seealso:
  - module: ttfleet.inference.model_spec
    description: Gives model_name, mesh, impl_id, tt_metal_commit and vllm_commit of a served model.
  - name: Role ttfleet.inference.model_cache
    description: Deploys caches during the normal run and harvests them with C(tasks_from=harvest).
    link: https://github.com/ttfleet/ttfleet.inference/blob/main/roles/model_cache/README.md
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
- name: Harvest the kernel cache of a warmed-up Qwen3-32B into an NFS store
  ttfleet.inference.kernel_cache:
    state: harvested
    volume: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0
    model_name: Qwen3-32B
    mesh: P300x2
    impl_id: tt_transformers
    tt_metal_commit: 8c48a10
    vllm_commit: f52987a
    store: path
    store_path: /mnt/kernel-store
    health_url: http://127.0.0.1:8000/health

- name: Deploy it on another QuietBox 2 before the first start
  ttfleet.inference.kernel_cache:
    volume: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0
    model_name: Qwen3-32B
    mesh: P300x2
    impl_id: tt_transformers
    tt_metal_commit: 8c48a10
    vllm_commit: f52987a
    store: path
    store_path: /mnt/kernel-store
"""

RETURN = r"""
action:
  description: What happened (or would, in check mode), V(deployed), V(harvested) or V(none).
  returned: always
  type: str
  sample: deployed
reason:
  description: One sentence on the outcome, for example why nothing was deployed.
  returned: always
  type: str
  sample: the store /mnt/kernel-store holds no kernel cache of Qwen3-32B on P300x2 (...); harvest one after a warm-up
cache_path:
  description: The cache directory, C(<volume>/tt_metal_cache/cache_<model_name>/<mesh>).
  returned: always
  type: str
  sample: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0/tt_metal_cache/cache_Qwen3-32B/P300x2
store:
  description: Where the store entry of the key is.
  returned: unless O(state=inspected)
  type: str
  sample: /mnt/kernel-store/Qwen3-32B/P300x2/tt_transformers/8c48a10/f52987a
kept:
  description: The entry of O(keep_store_path) that now holds the verified archive.
  returned: when a deploy kept the archive
  type: str
  sample: /var/cache/ttfleet/kernel-store/Qwen3-32B/P300x2/tt_transformers/8c48a10/f52987a
store_failures:
  description:
    - The stores that failed before RV(store) served the deploy, in the order asked, each with what went wrong
      (URLs shown without their path, which is a peer's access token).
  returned: when O(store_fallback_urls) is set
  type: list
  elements: str
key:
  description: The key (model_name, mesh, impl_id, tt_metal_commit, vllm_commit).
  returned: always
  type: dict
manifest:
  description: The manifest of the store entry used or written.
  returned: when the store holds the key
  type: dict
files:
  description: Files packed or deployed.
  returned: when something is packed or deployed
  type: int
  sample: 5120
bytes:
  description: Their total size.
  returned: when something is packed or deployed
  type: int
  sample: 32212254720
archive_bytes:
  description: Size of the archive written or read.
  returned: when an archive was written or read
  type: int
sha256:
  description: sha256 of the archive, computed while it streamed.
  returned: when an archive was written or read
  type: str
hashed:
  description: Whether an archive was hashed in this run (never on a converged run).
  returned: always
  type: bool
missing:
  description: The store holds no entry for the key (with O(required=false)).
  returned: when true
  type: bool
moved_aside:
  description: Where a cache that was in the way was moved.
  returned: when O(force=true) moved one
  type: str
in_place:
  description: A cache deployed or harvested with this key is at RV(cache_path).
  returned: when O(state=inspected)
  type: bool
deployable:
  description: A deploy would put a cache in place (the path is empty, or O(force=true) moves the cache there aside).
  returned: when O(state=inspected)
  type: bool
evidence:
  description: The evidence of a warm-up a harvest relied on.
  returned: when harvested
  type: str
"""

import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._base.module import fail_on
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.deploy import deploy, deploy_from_any
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.harvest import harvest
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.http_store import HttpStore
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import KernelError, key_text
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.local import inspect
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.path_store import PathStore
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.s3_store import S3Store
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.scan import DEFAULT_TEMP_PATTERNS
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import S3Error
from ansible_collections.ttfleet.inference.plugins.module_utils._net.proxy import PROXY_OPTIONS, apply_proxy_env
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import mask_url_credentials
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.options import S3_OPTIONS


def _store(params: dict[str, Any], url: str | None = None) -> PathStore | HttpStore | S3Store:
    if params["store"] == "path":
        return PathStore(params["store_path"])
    if params["store"] == "http":
        return HttpStore(url or params["store_url"], params["timeout"], use_proxy=params["http_store_proxy"])
    try:
        client = S3Client.from_options(params)
    except S3Error as exc:
        raise KernelError(str(exc)) from None
    spool = params["spool"] or os.path.join(params["volume"], "tt_metal_cache")
    return S3Store(client, params["s3_bucket"], params["s3_prefix"], spool)


def _diff(params: dict[str, Any], result: dict[str, Any]) -> dict[str, str]:
    where = result["store"] if params["state"] == "harvested" else result["cache_path"]
    done = result["action"] != "none"
    if params["state"] == "harvested":
        before = "absent" if done else "present"
    else:
        before = "absent or another key" if done else (result.get("reason") or "")
    after = key_text(result["key"]) if done or params["state"] == "harvested" else before
    return {"before": f"{where}: {before}\n", "after": f"{where}: {after}\n"}


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **PROXY_OPTIONS,
            state=dict(type="str", choices=["deployed", "harvested", "inspected"], default="deployed"),
            volume=dict(type="path", required=True),
            model_name=dict(type="str", required=True),
            mesh=dict(type="str", required=True),
            impl_id=dict(type="str", required=True),
            tt_metal_commit=dict(type="str", required=True),
            vllm_commit=dict(type="str"),
            store=dict(type="str", choices=["path", "http", "s3"]),
            store_path=dict(type="path"),
            store_url=dict(type="str"),
            store_fallback_urls=dict(type="list", elements="str", default=[]),
            http_store_proxy=dict(type="bool", default=False),
            expected_sha256=dict(type="str"),
            keep_store_path=dict(type="path"),
            spool=dict(type="path"),
            health_url=dict(type="str"),
            warmed=dict(type="bool", default=False),
            require_marker=dict(type="bool", default=False),
            quiet_seconds=dict(type="int", default=120),
            temp_patterns=dict(type="list", elements="str", default=list(DEFAULT_TEMP_PATTERNS)),
            required=dict(type="bool", default=False),
            force=dict(type="bool", default=False),
            disk_margin_gb=dict(type="float", default=1),
            level=dict(type="int", default=3),
            owner=dict(type="int", default=1000),
            group=dict(type="int", default=1000),
            status_file=dict(type="path"),
            host=dict(type="str"),
            timeout=dict(type="int", default=60),
            **S3_OPTIONS,
        ),
        required_if=[
            ("state", "deployed", ["store"]),
            ("state", "harvested", ["store"]),
            ("store", "path", ["store_path"]),
            ("store", "http", ["store_url"]),
            ("store", "s3", ["s3_endpoint", "s3_bucket", "s3_access_key", "s3_secret_key"]),
        ],
        supports_check_mode=True,
    )
    params = module.params
    apply_proxy_env(module)
    credentials_error = mask_url_credentials(module, ("store_url", "store_fallback_urls", "health_url", "s3_endpoint"))
    with fail_on(module, os_error=f"kernel_cache ({params['state']}) of {params['model_name']} failed"):
        if credentials_error:
            raise KernelError(credentials_error)
        if not params["volume"].startswith("/"):
            raise KernelError(f"volume {params['volume']!r} must be an absolute path")
        if params["quiet_seconds"] < 0 or params["disk_margin_gb"] < 0:
            raise KernelError("quiet_seconds and disk_margin_gb must not be negative")
        if not 1 <= params["level"] <= 19:
            raise KernelError(f"level must be a zstd level from 1 to 19, got {params['level']}")
        if params["state"] == "inspected":
            module.exit_json(**inspect(params))
        store = _store(params)
        if params["state"] == "harvested":
            result = harvest(params, store, check_mode=module.check_mode)
        elif params["store"] == "http" and params["store_fallback_urls"]:
            stores = [store] + [_store(params, url) for url in params["store_fallback_urls"]]
            # store is http here, so every _store() above is an HttpStore; mypy cannot follow params["store"].
            result = deploy_from_any(params, stores, check_mode=module.check_mode)  # type: ignore[arg-type]
        else:
            result = deploy(params, store, check_mode=module.check_mode)
    result.setdefault("hashed", False)
    if result.get("missing"):
        module.warn(result["reason"])
    if params["store"] == "http" and params["expected_sha256"] is None and result["action"] == "deployed":
        module.warn(
            f"the deploy of the kernel cache of {params['model_name']} from {result['store']} trusts that store's own "
            "manifest, which it (or the network path to it) can rewrite with the archive; set expected_sha256 to the "
            "sha256 of the origin's manifest"
        )
    if module._diff:
        result["diff"] = _diff(params, result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
