# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""The ``docker run`` command of tt-inference-server (TTIS), computed from a model spec.

Pure functions, standard library only. The rules are those of ``generate_docker_run_command`` in
TTIS ``workflows/run_docker_server.py`` together with ``SetupConfig`` (``workflows/setup_host.py``),
``ModelSpec.apply_overrides`` (``workflows/model_spec.py``) and the image version check of
``workflows/validate_setup.py``, as run by ``run.py --docker-server --print-docker-cmd``.
Differences between releases are keyed on the catalog's release version (see ``_rules``). A catalog
with ``model_specs_env`` dev gets what ``run.py --dev-mode`` adds (see ``_dev_mounts``).

Deliberate differences from run.py: the container name is stable instead of random, the env file
is ours instead of ``<checkout>/.env``, and secrets (``API_KEY``, ``OPENAI_API_KEY``) stay in that
env file instead of being copied onto the command line with ``-e``.
"""

from __future__ import annotations

import os
import posixpath
import re
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.derive import derive
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.devices import (
    is_multihost,
    sdxl_cpp_devices,
    sdxl_cpp_settings,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.entrypoint import (
    TT_CONFIG_ARGS,
    Generation,
    check_carried,
    encode_tt_config,
    generation,
    json_arguments,
    tt_config_of,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import (
    CONTAINER_CACHE_ROOT,
    CONTAINER_HOME,
    DEFAULT_PORT,
    SERVE_CONFIG_DIR,
    container_name,
    container_path,
    sanitise_name,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.overrides import (
    VLLM_ARG_TO_ENV,
    drop_reserved,
    needs_runtime_spec,
    override_cli_args,
    strip_private,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.tags import (
    MIN_CURRENT_INTERFACE_VERSION,
    check_image,
    is_legacy_interface,
    override_image,
    parse_image_version,
    parse_version_tuple,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any, Protocol, TypedDict

    JSON = dict[str, Any]

    class ImageMap(Protocol):
        """The site's mirror of an image: the reference to run and the prefix that mapped it (None: not mapped)."""

        def __call__(self, image: str, what: str) -> tuple[str, str | None]:
            ...

    class Rules(TypedDict):
        """The release-dependent rules of ``_rules``."""

        split_publish: bool
        media_spec_env: bool
        cpp_needs_device: bool
        media_hf_home: bool
        dev_app_dirs: tuple[str, ...]
        dev_media_model_types: tuple[str, ...]
        override_args: bool


# Accepted bandit B104: run.py's own default (--bind-host), kept for parity.
DEFAULT_BIND_HOST = "0.0.0.0"  # nosec B104
# The UID of the release images; run.py adds --user only for another value.
DEFAULT_IMAGE_USER = "1000"
# Ours, not run.py's: no process in the container gains privileges through a setuid/setgid file or file capabilities
# (one planted on the read-write volume, or in an image that was swapped). Every release image works with it: vLLM and
# forge images start as their non-root USER, and the media image's root entrypoint only drops to it (gosu).
HARDENING = ("--security-opt", "no-new-privileges")

DEVICE_PATH = "/dev/tenstorrent"
# The images of tt-inference-server releases, whose tag starts with the release that built them.
TTIS_IMAGE_PREFIX = "ghcr.io/tenstorrent/"
HUGEPAGES_MOUNT = "type=bind,src=/dev/hugepages-1G,dst=/dev/hugepages-1G"
READONLY_WEIGHTS_MOUNT = CONTAINER_HOME + "/readonly_weights_mount"
# Media and forge servers (uvicorn and the C++ server) always listen on 8000 inside the container.
MEDIA_CONTAINER_PORT = 8000

# The SDXL models that run.py starts in the media image's C++ server (SERVER_MODE=cpp); its per-device settings are
# the sdxl_cpp column of _ttis.devices.
CPP_SDXL_RUNNERS = {
    "stable-diffusion-xl-base-1.0": "tt_sdxl_generate",
    "stable-diffusion-xl-base-1.0-img-2-img": "tt_sdxl_image_to_image",
    "stable-diffusion-xl-1.0-inpainting-0.1": "tt_sdxl_edit",
}

# Releases in which run_docker_server.py changed what this module reproduces.
_SPLIT_PUBLISH = (0, 14, 0)  # media/forge publish HOST:P:8000 and take no container arguments
_MEDIA_SPEC_ENV = (0, 15, 0)  # spec env_vars and NO_AUTH passed to media/forge; SDXL C++ server
_CPP_NEEDS_DEVICE = (0, 16, 0)  # C++ server only on the devices of its table (v0.15 failed otherwise)
_MEDIA_HF_HOME = (0, 19, 0)  # HF_HOME on the cache_root volume for media/forge
_DEV_REFERENCE_CONFIG = (0, 19, 0)  # --dev-mode mounts reference_config/ instead of benchmarking/ and evals/
_DEV_TRAINING_MEDIA = (0, 20, 0)  # --dev-mode counts TRAINING specs as media server specs
_OVERRIDE_ARGS = (0, 17, 0)  # --vllm-override-args reaches a vLLM container as its arguments (_vllm_override_cli_args)

# run.py --dev-mode --docker-server (v0.16.0 and later, generate_docker_run_command): the resolved spec goes into the
# container as a read-only JSON named by RUNTIME_MODEL_SPEC_JSON_PATH, which the vLLM entrypoint reads instead of the
# image's own prod catalog, and the checkout's sources are bind-mounted over the image's.
DEV_SPEC_DIR = CONTAINER_HOME + "/model_specs"
DEV_APP_DIR = CONTAINER_HOME + "/app"
DEV_MEDIA_SERVER_DIR = CONTAINER_HOME + "/tt-metal/server"
_DEV_MEDIA_MODEL_TYPES = ("CNN", "IMAGE", "EMBEDDING", "VIDEO", "TEXT_TO_SPEECH", "AUDIO")

_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_MOUNT_UNSAFE = re.compile(r'[,="]')
_TOKEN = re.compile(r"^[A-Za-z0-9_.:\[\]%-]+\Z")


def _rules(release_version: object) -> Rules:
    """Which release-dependent rules apply; an unknown release gets the newest ones."""
    released = parse_version_tuple(release_version)

    def since(first: tuple[int, int, int]) -> bool:
        return released is None or released >= first

    return {
        "split_publish": since(_SPLIT_PUBLISH),
        "media_spec_env": since(_MEDIA_SPEC_ENV),
        "cpp_needs_device": since(_CPP_NEEDS_DEVICE),
        "media_hf_home": since(_MEDIA_HF_HOME),
        "dev_app_dirs": ("reference_config", "utils", "tests")
        if since(_DEV_REFERENCE_CONFIG)
        else ("benchmarking", "evals", "utils", "tests"),
        "dev_media_model_types": _DEV_MEDIA_MODEL_TYPES + (("TRAINING",) if since(_DEV_TRAINING_MEDIA) else ()),
        "override_args": since(_OVERRIDE_ARGS),
    }


# ---------------------------------------------------------------------------------------------
# Input checks


def _absolute_path(value: object, option: str, mount: bool = False) -> str:
    if not isinstance(value, str) or not value or _CONTROL_CHARS.search(value):
        raise SpecError(f"{option} {value!r} must be an absolute path without control characters.")
    path = os.path.expanduser(value)
    if not posixpath.isabs(path):
        raise SpecError(f"{option} {value!r} must be an absolute path (for example /opt/tt-cache).")
    path = posixpath.normpath(path)
    unsafe = _MOUNT_UNSAFE.search(path) if mount else None
    if unsafe:
        # docker run --mount reads its value as CSV of key=value options.
        raise SpecError(
            f"{option} {value!r} contains {unsafe.group()!r}, which docker run --mount cannot take (it would change "
            "the mount options); rename the directory."
        )
    return path


def _token(value: object, option: str, example: str) -> str:
    text = str(value) if value is not None else ""
    if not text or not _TOKEN.match(text) or text.startswith("-"):
        raise SpecError(f"{option} {value!r} is not valid; give a single word such as {example}.")
    return text


def _port(value: int | str) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = 0
    if isinstance(value, bool) or not 1 <= port <= 65535 or str(port) != str(value).strip():
        raise SpecError(f"port {value!r} must be an integer from 1 to 65535 (run.py --service-port).")
    return port


def _device_ids(values: Iterable[int] | None) -> list[int]:
    ids: list[int] = []
    for value in values or ():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SpecError(
                f"device_ids {values!r} must be non-negative integers (indices of /dev/tenstorrent/N), got {value!r}."
            )
        ids.append(value)
    return ids


def _legacy_message(derived: Mapping[str, Any], image: str, version: str, release: str) -> str:
    commits = ", ".join(
        f"{label} {commit}"
        for label, commit in (("tt-metal", derived["tt_metal_commit"]), ("vLLM", derived["vllm_commit"]))
        if commit
    )
    minimum = ".".join(str(part) for part in MIN_CURRENT_INTERFACE_VERSION)
    return (
        f"{derived['model_name']} on {derived['device']} pins image {image}, version v{version}, older than "
        f"v{minimum}: run.py {release} refuses it ('Image v{version} is not supported in this version of run.py') "
        "because such images use the older container interface (gosu entrypoint, MODEL_WEIGHTS_PATH and a runtime "
        "model spec JSON written by that release's run.py), which this module does not generate. Set image to a "
        f"v{minimum} or newer build of the same commits ({commits or 'see the spec'}), or serve the model with "
        f"tt-inference-server release v{version}."
    )


def image_generation(image: str) -> Generation:
    """The start-up generation (entrypoint.py) of a vLLM ``image``: by the version its tag starts with for an image of
    tt-inference-server (its registry path or a ``vllm-tt-metal`` repository at a mirror), else the current one."""
    repository = image.rsplit("@", 1)[0]
    if ":" in posixpath.basename(repository):
        repository = repository.rsplit(":", 1)[0]
    if image.startswith(TTIS_IMAGE_PREFIX) or posixpath.basename(repository).startswith("vllm-tt-metal"):
        return generation(parse_image_version(image.rsplit("@", 1)[0]))
    return generation(None)


def _version_label(image: str) -> str:
    """The version an image's tag starts with, as text (``unknown`` for ``latest`` and the like)."""
    version = parse_image_version(image.rsplit("@", 1)[0])
    return ".".join(map(str, version)) if version else "unknown"


def _check_media_tuning(tuning: Mapping[str, Any], derived: Mapping[str, Any], image: str) -> None:
    """Refuse tuning a media or forge image cannot take: it starts tt-media-server with MODEL, DEVICE and its
    environment, and of the vLLM arguments only max_num_seqs and max_model_len reach it (as MAX_NUM_SEQS and
    MAX_MODEL_LENGTH). run.py accepts the rest and drops it without a word."""
    where = (
        f"{derived['model_name']} on {derived['device']} ({derived['inference_engine']} image {image}, version "
        f"{_version_label(image)})"
    )
    tt_config = tuning.get("override_tt_config") or {}
    if tt_config:
        raise SpecError(
            f"{where}: override_tt_config key {sorted(tt_config)[0]!r} cannot take effect: this image starts "
            "tt-media-server, which reads no TT config (its runners take their settings from the environment). Remove "
            "override_tt_config from the entry or its profile; set a runner setting with env."
        )
    for key in tuning.get("vllm_override_args") or {}:
        if key not in VLLM_ARG_TO_ENV:
            raise SpecError(
                f"{where}: vllm_override_args key {key!r} cannot take effect: this image starts tt-media-server, which "
                f"reads only {' and '.join(sorted(VLLM_ARG_TO_ENV))} of the vLLM arguments (as "
                f"{' and '.join(VLLM_ARG_TO_ENV[k] for k in sorted(VLLM_ARG_TO_ENV))}). Remove the key, or set the "
                "server's own environment variable with env."
            )


# ---------------------------------------------------------------------------------------------
# The command


def _is_cpp(derived: Mapping[str, Any], rules: Rules) -> bool:
    """Whether run.py starts the spec in the media image's C++ server (_is_cpp_media_spec)."""
    cpp = derived["inference_engine"] == "media" and derived["model_name"] in CPP_SDXL_RUNNERS
    if cpp and rules["cpp_needs_device"]:
        cpp = sdxl_cpp_settings(derived["device"]) is not None
    return cpp


def _spec_env(spec: Mapping[str, Any], derived: Mapping[str, Any], rules: Rules) -> dict[str, str]:
    """The spec's environment run.py passes to media and forge images, without the names the collection reserves.

    Those (overrides.RESERVED_ENV: auth, caches, weights, spec path) are set by the collection after this, or left
    unset on purpose (NO_AUTH without no_auth), so a spec never decides them.
    """
    if not rules["media_spec_env"]:
        return {}
    spec_env = spec.get("env_vars")
    if not isinstance(spec_env, dict):
        spec_env = derived["env_vars"]
    return {key: str(value) for key, value in drop_reserved(spec_env).items()}


def _media_env(derived: Mapping[str, Any], rules: Rules) -> dict[str, str]:
    """Environment run.py adds for media and forge images after the spec's, in its order."""
    env: dict[str, str] = {}
    device = derived["device"]
    cpp = _is_cpp(derived, rules)
    if rules["media_spec_env"] and cpp:
        settings = sdxl_cpp_settings(device)
        if settings is None:
            raise SpecError(
                f"{derived['model_name']} runs in the C++ media server, which has no settings for device {device}; "
                f"supported devices: {', '.join(sdxl_cpp_devices())}."
            )
        mesh_shape, is_galaxy, ids = settings
        env.update(
            {
                "SERVER_MODE": "cpp",
                "MODEL_SERVICE": "image",
                "MODEL_RUNNER_TYPE": CPP_SDXL_RUNNERS[derived["model_name"]],
                "DEVICE_MESH_SHAPE": mesh_shape,
                "IS_GALAXY": "true" if is_galaxy else "false",
                "DEVICE_IDS": ids,
                "MAX_BATCH_SIZE": "1",
                "SDXL_IMAGE_RESOLUTION": "1024x1024",
            }
        )
    else:
        env["CACHE_ROOT"] = CONTAINER_CACHE_ROOT
        if rules["media_hf_home"]:
            env["HF_HOME"] = container_path("huggingface")
        env["MODEL"] = derived["model_name"]
        env["DEVICE"] = device
    return env


def _dev_mounts(
    catalog: Mapping[str, Any],
    spec: Mapping[str, Any],
    derived: Mapping[str, Any],
    rules: Rules,
    runtime_spec_file: str | None,
) -> tuple[list[str], str]:
    """``--mount`` arguments of run.py --dev-mode and the container path of the runtime spec JSON."""
    checkout = catalog.get("checkout")
    if not checkout:
        raise SpecError("The dev catalog comes from a checkout's code; give tt_inference_server_dir.")
    checkout = _absolute_path(checkout, "tt_inference_server_dir", mount=True)
    if not runtime_spec_file:
        raise SpecError(
            "run.py --dev-mode passes the resolved dev spec into the container as a JSON file named by "
            "RUNTIME_MODEL_SPEC_JSON_PATH (the image's own catalog is prod); set runtime_spec_file to where that file "
            "is written on the host (the returned runtime_model_spec)."
        )
    spec_path = _absolute_path(runtime_spec_file, "runtime_spec_file", mount=True)
    spec_in_container = f"{DEV_SPEC_DIR}/{posixpath.basename(spec_path)}"
    mounts = ["--mount", f"type=bind,src={spec_path},dst={spec_in_container},readonly"]
    for name in rules["dev_app_dirs"]:
        mounts += ["--mount", f"type=bind,src={checkout}/{name},dst={DEV_APP_DIR}/{name}"]
    media_server = f"{checkout}/tt-media-server"
    if spec.get("model_type") in rules["dev_media_model_types"]:
        if not _is_cpp(derived, rules):
            mounts += ["--mount", f"type=bind,src={media_server},dst={DEV_MEDIA_SERVER_DIR}"]
        else:
            # The C++ server's build stays the image's: every other entry of tt-media-server/ is mounted on its own.
            try:
                entries = sorted(os.listdir(media_server))
            except OSError as exc:
                raise SpecError(
                    f"cannot list {media_server} to mount it as run.py --dev-mode does: {exc.strerror or exc}"
                ) from exc
            for entry in entries:
                if entry != "cpp_server":
                    source = _absolute_path(f"{media_server}/{entry}", "tt-media-server entry", mount=True)
                    mounts += ["--mount", f"type=bind,src={source},dst={DEV_MEDIA_SERVER_DIR}/{entry}"]
    else:
        mounts += ["--mount", f"type=bind,src={checkout}/vllm-tt-metal/src,dst={DEV_APP_DIR}/src"]
    return mounts, spec_in_container


def _runtime_model_spec(spec: Mapping[str, Any], port: int, gen: Generation, image_version: str) -> JSON:
    """The spec as run.py --dev-mode writes it for the container (ModelSpec.apply_overrides: port).

    Its TT config is under the argument the image's generation reads (``gen``): the mounted spec replaces the image's
    own catalog, which says it that way, so a spec in a newer release's words would lose the TT config there.
    """
    runtime = strip_private(spec)
    dms = dict(runtime.get("device_model_spec") or {})
    # The vLLM entrypoint sets the spec's env_vars over the container's environment (set_runtime_env_vars), so a
    # reserved name there would override the collection's -e values: the spec carries none.
    for mapping in (runtime, dms):
        if isinstance(mapping.get("env_vars"), dict):
            mapping["env_vars"] = drop_reserved(mapping["env_vars"])
    vllm_args = dict(dms.get("vllm_args") or {})
    if set(vllm_args) & TT_CONFIG_ARGS != {gen.tt_config_arg}:
        where = f"{runtime.get('model_name')} on {str(runtime.get('device_type')).lower()}"
        try:
            check_carried(where, vllm_args, gen, image_version)
        except ValueError as exc:
            raise SpecError(str(exc)) from exc
        vllm_args = encode_tt_config(vllm_args, tt_config_of(vllm_args, dms.get("override_tt_config")), gen)
    dms["vllm_args"] = {**json_arguments(vllm_args), "port": str(port)}
    runtime["device_model_spec"] = dms
    return runtime


def container_command(
    spec: Mapping[str, Any],
    catalog: Mapping[str, Any] | None = None,
    volume_root: str | None = None,
    port: int | str = DEFAULT_PORT,
    bind_host: str = DEFAULT_BIND_HOST,
    device_ids: Iterable[int] | None = None,
    no_auth: bool = False,
    image: str | None = None,
    image_user: str | None = DEFAULT_IMAGE_USER,
    env_file: str | None = None,
    name: str | None = None,
    host_weights_dir: str | None = None,
    runtime_spec_file: str | None = None,
    tuning: Mapping[str, Any] | None = None,
    image_map: ImageMap | None = None,
) -> JSON:
    """The ``docker run`` argv that serves ``spec``, as run.py --docker-server prints it.

    ``image_map(image, what)`` gives the reference to run and the registry prefix that mapped it, or raises naming
    ``what``: the caller's site mirrors (tt_registry_mirrors, through the images layer above this one). The argv
    then runs the mapped reference, returned as ``image`` (``image_origin`` is the spec's or the override's); without
    it the image runs as named.

    Returns a dict with ``argv``, ``image``, ``container_name``, ``env_file``, ``version`` (after an
    image override), ``volume`` (host directory or Docker named volume), ``legacy_interface`` (of the
    spec's own image), ``inference_engine`` and ``runtime_model_spec`` (for a spec of the dev catalog,
    the JSON document to write to ``runtime_spec_file``, else None). Raises SpecError for what run.py
    would refuse.

    ``spec`` has its tuning applied already (select.select_entry); ``tuning`` (from overrides.check_tuning) adds
    the container arguments of ``--vllm-override-args``, as run.py does for vLLM images. Where those arguments
    cannot carry the tuning (a removal, the TT config, extra environment) or the spec is not in the image's
    catalog (a runtime model spec), a vLLM container gets the resolved spec as run.py --dev-mode passes it: a
    read-only JSON named by RUNTIME_MODEL_SPEC_JSON_PATH, which the image's entrypoint reads instead of its own
    catalog. run.py itself does neither: there the TT config and removals never reach the container, and a model
    outside the image's catalog does not start.
    """
    tuning = tuning or {}
    runtime_source = catalog is not None and catalog.get("source") == "runtime_model_spec"
    catalog = catalog or {}
    dev = catalog.get("model_specs_env") == "dev"
    if image is not None:
        image = check_image(image)
    elif not spec.get("docker_image"):
        raise SpecError(
            f"The spec of {spec.get('model_name')!r} on {spec.get('device_type')!r} pins no Docker image "
            "(a dev spec): as run.py --dev-mode --docker-server requires --override-docker-image, set image; the "
            "version its tag starts with names the volume."
        )
    # ModelSpec.apply_overrides: an image override also replaces the version (volume name and
    # image check) when its tag starts with one; ':latest' or ':dev' keep the spec's.
    run_spec = override_image(spec, image)
    derived = derive(run_spec, catalog)
    image = derived["docker_image"]
    version = derived["version"]
    # The version whose image interface counts. A runtime spec's (a model package's) version names its volume, not
    # a tt-inference-server interface: only the tag of a tt-inference-server image tells that; any other image
    # has the current interface (an unparseable version counts as current).
    interface_version: object = version
    own_legacy = is_legacy_interface(spec.get("inference_engine") or "vLLM", spec.get("version"))
    if runtime_source:
        tag = parse_image_version(image) if image.startswith(TTIS_IMAGE_PREFIX) else None
        interface_version = ".".join(map(str, tag)) if tag else None
        own_legacy = False
    release = catalog.get("release_version")
    release_label = f"v{release}" if release else "of this release"
    if catalog.get("legacy_layout"):
        raise SpecError(
            f"The specs come from tt-inference-server {release or 'before v0.11'}, whose run.py started containers "
            "with an older interface (runtime model spec JSON, MODEL_WEIGHTS_PATH) that this module does not "
            "generate. Install release v0.11.0 or later with the ttfleet.inference.inference_server role, or give "
            "the spec_file of such a release."
        )
    if is_multihost(derived["device_type"]):
        raise SpecError(
            f"{derived['model_name']} on {derived['device']} is a multi-host deployment: run.py starts worker "
            "containers on every host plus a controller, not one container. Serve a single-host device instead."
        )
    engine = derived["inference_engine"]
    rules = _rules(release)
    gen = image_generation(image)
    if engine in ("media", "forge"):
        _check_media_tuning(tuning, derived, image)
    if is_legacy_interface(engine, interface_version):
        raise SpecError(_legacy_message(derived, image, version, release_label))

    port = _port(port)
    bind_host = _token(bind_host, "bind_host", "0.0.0.0 or 127.0.0.1")
    image_user = _token(image_user, "image_user", "1000") if image_user not in (None, "") else ""
    ids = _device_ids(device_ids)
    root = _absolute_path(volume_root, "volume_root", mount=True) if volume_root else None
    weights_dir = _absolute_path(host_weights_dir, "host_weights_dir", mount=True) if host_weights_dir else None
    if weights_dir == "/":
        raise SpecError("host_weights_dir '/' has no directory name to mount; give the weights directory itself.")

    container = sanitise_name(name) if name else container_name(derived["model_name"], derived["device"], port)
    env_file = (
        _absolute_path(env_file, "env_file") if env_file else posixpath.join(SERVE_CONFIG_DIR, container + ".env")
    )

    argv = ["docker", "run", "--rm", "--name", container]
    if image_user and image_user != DEFAULT_IMAGE_USER:
        argv += ["--user", image_user]
    argv += ["--env-file", env_file, "--ipc", "host"]
    argv += list(HARDENING)
    if ids:
        for index in ids:
            argv += ["--device", f"{DEVICE_PATH}/{index}:{DEVICE_PATH}/{index}"]
    else:
        argv += ["--device", f"{DEVICE_PATH}:{DEVICE_PATH}"]
    argv += ["--mount", HUGEPAGES_MOUNT]
    media = engine in ("media", "forge")
    inner_port = MEDIA_CONTAINER_PORT if media and rules["split_publish"] else port
    argv += ["--publish", f"{bind_host}:{port}:{inner_port}"]

    if root:
        volume = posixpath.join(root, derived["volume_name"])
        argv += ["--mount", f"type=bind,src={volume},dst={CONTAINER_CACHE_ROOT}"]
    else:
        volume = derived["named_volume"]
        argv += ["--volume", f"{volume}:{CONTAINER_CACHE_ROOT}"]
    env: dict[str, str] = {}
    if weights_dir:
        weights_mount = f"{READONLY_WEIGHTS_MOUNT}/{posixpath.basename(weights_dir)}"
        argv += ["--mount", f"type=bind,src={weights_dir},dst={weights_mount},readonly"]
        env["MODEL_WEIGHTS_DIR"] = weights_mount
    if root:
        # Only with a host volume: the named volume keeps the image's default cache path.
        env["TT_CACHE_PATH"] = derived["container"]["tt_cache_path"]
    if media:
        # run.py's order; the spec's environment holds no reserved name (_spec_env), so the collection's values win.
        env.update(_spec_env(spec, derived, rules))
        env.update(_media_env(derived, rules))
        if no_auth and rules["media_spec_env"]:
            env["NO_AUTH"] = "1"
    runtime_model_spec: JSON | None = None
    if dev:
        mounts, env["RUNTIME_MODEL_SPEC_JSON_PATH"] = _dev_mounts(catalog, spec, derived, rules, runtime_spec_file)
        argv += mounts
        runtime_model_spec = {"runtime_model_spec": _runtime_model_spec(run_spec, port, gen, _version_label(image))}
    elif engine == "vLLM" and (
        runtime_source
        or needs_runtime_spec(tuning)
        # Before v0.17.0 run.py passed no override to the container at all; a 0.11.x image puts the spec's vLLM
        # arguments after the container's, where they win.
        or (tuning.get("vllm_override_args") and not (rules["override_args"] and gen.cli_over_spec))
    ):
        if not runtime_spec_file:
            raise SpecError(
                f"{derived['model_name']}: its tuning or its own spec reaches the container only as a runtime model "
                "spec JSON (RUNTIME_MODEL_SPEC_JSON_PATH); set runtime_spec_file to where that file is written on "
                "the host (the returned runtime_model_spec)."
            )
        spec_path = _absolute_path(runtime_spec_file, "runtime_spec_file", mount=True)
        env["RUNTIME_MODEL_SPEC_JSON_PATH"] = f"{DEV_SPEC_DIR}/{posixpath.basename(spec_path)}"
        argv += ["--mount", f"type=bind,src={spec_path},dst={env['RUNTIME_MODEL_SPEC_JSON_PATH']},readonly"]
        runtime_model_spec = {"runtime_model_spec": _runtime_model_spec(run_spec, port, gen, _version_label(image))}
    for key, value in env.items():
        if value:
            argv += ["-e", f"{key}={value}"]

    # The site's mirror of the image (tt_registry_mirrors): only the registry prefix changes.
    pulled, mirror_prefix = image_map(image, f"the image of {derived['model_name']}") if image_map else (image, None)
    argv.append(pulled)
    if engine == "vLLM" or not rules["split_publish"]:
        argv += ["--model", derived["hf_model_repo"], "--tt-device", derived["device"]]
        if no_auth:
            argv.append("--no-auth")
        if port != DEFAULT_PORT:
            argv += ["--service-port", str(port)]
    if engine == "vLLM" and rules["override_args"] and (gen.cli_over_spec or runtime_model_spec is None):
        argv += override_cli_args(tuning.get("vllm_override_args"))
    if engine == "vLLM" and not gen.service_port_to_vllm and port != DEFAULT_PORT and runtime_model_spec is None:
        # A 0.11.x wrapper keeps --service-port for itself; vLLM gets the port as its own argument (the image's
        # catalog sets none).
        argv += ["--port", str(port)]

    return {
        "argv": argv,
        "image": pulled,
        "image_origin": image,
        "image_mirror": mirror_prefix,
        "container_name": container,
        "env_file": env_file,
        "version": version,
        "volume": volume,
        "legacy_interface": own_legacy,
        "inference_engine": engine,
        "runtime_model_spec": runtime_model_spec,
        "model_name": derived["model_name"],
        "hf_model_repo": derived["hf_model_repo"],
        "impl_id": derived["impl_id"],
        "impl_name": derived["impl_name"],
        "device": derived["device"],
        "port": port,
        "tensor_cache_timeout": derived["tensor_cache_timeout"],
        "tt_metal_cache_subdir": derived["tt_metal_cache_subdir"],
        "profile": derived["profile"],
    }
