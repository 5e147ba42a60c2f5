"""Plain helpers (not fixtures) that unit test files in several directories share; the test tree mirrors plugins/.

Imported by name (``from unit_helpers import KEY``): tests/unit is on sys.path through its conftest.py.
"""

import os
import tarfile

# ---------------------------------------------------------------------------
# Files


def unpack(archive_path, dest):
    """Extract a fixture archive under ``dest``, with tarfile's data filter where this Python has it (3.11.4)."""
    with tarfile.open(archive_path) as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(dest, filter="data")
        else:
            archive.extractall(dest)


def make_tree(root, files):
    for rel, content in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(content)


# ---------------------------------------------------------------------------
# Kernel caches (module_utils._kernels)


KEY = {
    "model_name": "Qwen3-32B",
    "mesh": "P300x2",
    "impl_id": "tt_transformers",
    "tt_metal_commit": "8c48a10",
    "vllm_commit": "f52987a",
}
OLD = 1_000_000_000  # an mtime long past, so quiet_seconds is satisfied


def warm_cache(volume, key=None, files=None):
    """A cache in the real layout with real bytes, as a warmed-up server leaves it."""
    key = KEY if key is None else key
    root = os.path.join(volume, "tt_metal_cache", f"cache_{key['model_name']}", key["mesh"])
    files = files or {
        "kernels/abc123/brisc/brisc.elf": os.urandom(4096),
        "kernels/abc123/ncrisc/ncrisc.elf": os.urandom(2048),
        "tensor_cache/layers.0.attention.wqkv_dtype_BFLOAT8_B.tensorbin": os.urandom(70000),
        "tensor_cache/empty_ok.bin": b"",
    }
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), (OLD, OLD))
    os.utime(root, (OLD, OLD))
    return root, files


def opts(volume, **extra):
    base = dict(KEY, volume=str(volume), host="lab", quiet_seconds=60, owner=os.getuid(), group=os.getgid())
    base.update(extra)
    return base


def tree(root):
    out = {}
    for dirpath, _dirs, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = handle.read()
    return out


# ---------------------------------------------------------------------------
# Specs from outside the catalog (module_utils._overrides, run.py's runtime model spec format)


def package_spec(**changes):
    """A runtime model spec of Qwen/Qwen3.8-27B on p150x2 (seed 004's package), with ``changes`` applied."""
    spec = {
        "model_id": "id_qwen36_Qwen3.8-27B_p150x2",
        "impl": {"impl_id": "qwen36", "impl_name": "qwen36"},
        "hf_model_repo": "Qwen/Qwen3.8-27B",
        "model_name": "Qwen3.8-27B",
        "inference_engine": "vLLM",
        "device_type": "P150X2",
        "version": "0.1.0",
        "docker_image": "registry.example/qwen3.8-27b-p150x2:0.1.0",
        "tt_metal_commit": "fee9e0d35948111be29083c4eb144023d86890d8",
        "device_model_spec": {
            "device": "P150X2",
            "max_concurrency": 32,
            "max_context": 65536,
            "env_vars": {"MESH_DEVICE": "P150x2"},
        },
    }
    spec.update(changes)
    return spec


def with_hardening(argv):
    """An argv run.py printed, plus the one option the collection adds to every container (_container.HARDENING),
    right after ``--ipc host``."""
    from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.container import HARDENING

    out = list(argv)
    at = out.index("--ipc") + 2
    return out[:at] + list(HARDENING) + out[at:]
