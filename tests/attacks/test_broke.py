"""The "Broke" cases 1-10 of issue 13, each as the hostile uid 1000 against the real root-run modules.

Every one of them changed a root-only victim, leaked it to uid 1000, blocked a module, or let a bad input through
on the code before the fix; the tests pass only when the fix holds.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import (
    CHECKOUT,
    COLLECTIONS,
    MESH,
    MODEL,
    PYTHON,
    UID,
    attacker,
    attacker_loop,
    attacker_script,
    build_kernel_entry,
    cache_dir,
    fake_peer,
    finish_module,
    kernel_args,
    kernel_key,
    release,
    start_module,
    tar_member,
    weights_manifest,
    weights_server,
)

WEIGHTS = {
    "config.json": b'{"model_type": "qwen3"}\n',
    "tokenizer.json": b'{"version": "1.0"}\n',
    "model-00001-of-00001.safetensors": b"\0" * 4096,
}


def _kernel_store(arena):
    """A root-only path store holding a good entry of the test key."""
    store = arena.private / "store"
    members = [tar_member("blob", data=b"compiled kernel\n" * 64), tar_member("sub", kind="dir")]
    members.append(tar_member("sub/program.bin", data=b"\x7fELF" * 256))
    build_kernel_entry(store, kernel_key(), members)
    return store


def _warm_cache(arena):
    """A complete kernel cache written by the server (uid 1000) in the volume."""
    for rel, data in {"blob": b"compiled kernel\n" * 64, "sub/program.bin": b"\x7fELF" * 256}.items():
        arena.write(cache_dir(arena) / rel, data)


# ---------------------------------------------------------------------------
# 1. kernel_cache wrote its marker through a predictable temp name, following links, then chowned it to 1000.


@pytest.mark.broke(1)
@pytest.mark.parametrize("state", ["harvested", "deployed"])
def test_case01_kernel_marker_temp_name_prelinked(arena, state):
    marker_dir = cache_dir(arena).parent
    arena.mkdirs(marker_dir)
    if state == "harvested":
        _warm_cache(arena)
        args = kernel_args(arena, state, warmed=True, quiet_seconds=0, store="path")
        args["store_path"] = str(arena.mkdirs(arena.private / "store", owner=0))
    else:
        args = kernel_args(arena, state, store="path", store_path=str(_kernel_store(arena)))
    proc = start_module("kernel_cache", args, arena.private, hold=True)
    try:
        # The module keeps the pid it is exec'ed with. The attacker linked every pid (1-32768); linking
        # the names of a range around the known pid proves the same in a fraction of the time (symlinks are slow).
        name = f".ttfleet-tmp-.ttfleet-kernels-{MESH}.json."
        attacker_script("prelink", marker_dir, name, "", arena.victim, max(proc.pid - 100, 2), 200)
        release(proc)
    finally:
        result = finish_module(proc)
    assert not result.timed_out, result
    arena.assert_victims_intact()
    assert not result.failed, f"a {state} run next to uid 1000's links must still work: {result!r}"
    assert result["action"] == state, result


# ---------------------------------------------------------------------------
# 2. model_weights opened the staging .ttfleet-part file by name even when it was a symlink.


@pytest.mark.broke(2)
def test_case02_staging_part_symlink(arena):
    revision = "a" * 40
    dest = arena.volume / "weights" / MODEL
    staging = arena.volume / "weights" / ".ttfleet-staging" / MODEL
    arena.mkdirs(staging)
    # A staging state that matches the source, so the module resumes instead of clearing the directory.
    state = {"identity": {"repo_id": "Qwen/Qwen3-32B", "revision": revision}, "files": {}}
    arena.write(staging / ".ttfleet-staging", json.dumps(state))
    for rel in WEIGHTS:
        attacker("ln", "-s", arena.victim, staging / f"{rel}.ttfleet-part")
    with fake_peer(arena, WEIGHTS, revision=revision) as base:
        result = arena.module(
            "model_weights",
            {
                "dest": str(dest),
                "source": "peer",
                "repo_id": "Qwen/Qwen3-32B",
                "revision": revision,
                "peer_url": f"{base}/tok/",
                "disk_margin_gb": 0,
            },
        )
    assert not result.timed_out, result
    arena.assert_victims_intact()
    if not result.failed:
        assert (dest / "config.json").read_bytes() == WEIGHTS["config.json"]


# ---------------------------------------------------------------------------
# 3. model_weights wrote through a destination that uid 1000 replaced with a symlink to a root-only directory.


def _root_source(arena):
    source = arena.private / "source"
    for rel, data in WEIGHTS.items():
        arena.write(source / rel, data, owner=0)
    return source


@pytest.mark.broke(3)
def test_case03_destination_symlink_to_root_dir(arena):
    weights = arena.volume / "weights"
    arena.mkdirs(weights)
    attacker("ln", "-s", arena.victim_dir, weights / MODEL)
    result = arena.module(
        "model_weights",
        {"dest": str(weights / MODEL), "source": "path", "path": str(_root_source(arena)), "disk_margin_gb": 0},
    )
    assert not result.timed_out, result
    arena.assert_victims_intact()


# ---------------------------------------------------------------------------
# 4. source: path followed symlinks in an attacker-writable source; the cross-filesystem copy was 1000-owned 0644.


@pytest.fixture
def other_filesystem(arena):
    """A directory owned by 1000 on another filesystem than the arena (tmpfs /dev/shm), removed afterwards."""
    base = Path("/dev/shm")
    if not base.is_dir() or os.stat(base).st_dev == os.stat(arena.path).st_dev:
        pytest.fail("case 4 needs /dev/shm on another filesystem than /var/tmp (a cross-filesystem copy)")
    path = Path(tempfile.mkdtemp(prefix="ttfleet-attack-", dir=base))
    os.chmod(path, 0o755)
    os.lchown(path, UID, UID)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.broke(4)
@pytest.mark.parametrize("layout", ["cross-filesystem", "same-filesystem"])
def test_case04_path_source_symlink_to_root_file(arena, other_filesystem, layout):
    """uid 1000's source tree links a root-only file; the copy (or hardlink) must not reach uid 1000's volume."""
    source = arena.home / "model"
    arena.mkdirs(source)
    for rel, data in WEIGHTS.items():
        if rel != "config.json":
            arena.write(source / rel, data)
    attacker("ln", "-s", arena.victim, source / "config.json")
    attacker("ln", "-s", arena.victim, source / "extra.txt")
    volume = other_filesystem if layout == "cross-filesystem" else arena.volume
    dest = volume / "weights" / MODEL
    result = arena.module(
        "model_weights", {"dest": str(dest), "source": "path", "path": str(source), "disk_margin_gb": 0}
    )
    assert not result.timed_out, result
    arena.assert_victims_intact()
    assert arena.leaked_to_attacker(volume) == [], f"uid 1000 can read the victim's content: {result!r}"


# ---------------------------------------------------------------------------
# 5. weights_server checked islink/realpath, then opened by name: a swap loop got outside files served.


@pytest.mark.broke(5)
def test_case05_weights_server_swap_race(arena):
    served = arena.volume / "weights" / MODEL
    real = b"REAL-CONFIG " + b"x" * 200 + b"\n"
    arena.write(served / "config.json", real)
    os.link(served / "config.json", served / "config.keep")
    arena.write(served / ".ttfleet-manifest.json", json.dumps(weights_manifest({"config.json": real})))
    with weights_server(arena, served) as started:
        assert not started.failed and not started.timed_out, started
        url = started["url"]
        host, port = re.match(r"^http://([^/:]+):(\d+)/", url).groups()
        path = url.split(f":{port}", 1)[1] + "config.json"
        counts = {"victim": 0, "real": 0, "other": 0}
        with attacker_loop("swap", served, "config.json", "config.keep", arena.victim, 30, cwd=served):
            time.sleep(0.2)
            deadline = time.monotonic() + 8
            conn = http.client.HTTPConnection(host, int(port), timeout=5)
            for _request in range(1500):
                if time.monotonic() > deadline:
                    break
                try:
                    conn.request("GET", path)
                    resp = conn.getresponse()
                    body = resp.read()
                except (OSError, http.client.HTTPException):
                    conn.close()
                    conn = http.client.HTTPConnection(host, int(port), timeout=5)
                    continue
                if arena.secret.encode() in body:
                    counts["victim"] += 1
                elif resp.status == 200 and body == real:
                    counts["real"] += 1
                else:
                    counts["other"] += 1
            conn.close()
    arena.assert_victims_intact()
    assert counts["victim"] == 0, f"the server sent the victim {counts['victim']} times: {counts}"
    assert counts["real"] > 0, f"the server never sent the listed file, the race was not exercised: {counts}"


# ---------------------------------------------------------------------------
# 6. A FIFO where a module reads a small file hung it (no regular-file check).

FIFO_TIMEOUT = 10


def _fifo(arena, path):
    arena.mkdirs(Path(path).parent)
    attacker("mkfifo", path)


@pytest.mark.broke(6)
def test_case06_fifo_shard_index_volume_facts(arena):
    weights = arena.volume / "weights" / MODEL
    for rel, data in WEIGHTS.items():
        arena.write(weights / rel, data)
    _fifo(arena, weights / "model.safetensors.index.json")
    result = arena.module("volume_facts", {"root": str(arena.root)}, timeout=FIFO_TIMEOUT)
    assert not result.timed_out, f"volume_facts blocked on a FIFO: {result!r}"
    arena.assert_victims_intact()


@pytest.mark.broke(6)
@pytest.mark.parametrize("state", ["inspected", "deployed"])
def test_case06_fifo_kernel_marker(arena, state):
    _fifo(arena, cache_dir(arena).parent / f".ttfleet-kernels-{MESH}.json")
    arena.write(cache_dir(arena) / "blob", b"compiled\n")
    args = kernel_args(arena, state)
    if state == "deployed":
        args.update(store="path", store_path=str(_kernel_store(arena)), force=True)
    result = arena.module("kernel_cache", args, timeout=FIFO_TIMEOUT)
    assert not result.timed_out, f"kernel_cache {state} blocked on a FIFO: {result!r}"
    arena.assert_victims_intact()


@pytest.mark.broke(6)
def test_case06_fifo_manifest_weights_server(arena):
    served = arena.volume / "weights" / MODEL
    arena.write(served / "config.json", WEIGHTS["config.json"])
    _fifo(arena, served / ".ttfleet-manifest.json")
    run_dir = arena.private / "run"
    arena.cleanups.append(
        lambda: arena.module("weights_server", {"state": "stopped", "name": "fifo", "run_dir": str(run_dir)})
    )
    args = {"state": "started", "name": "fifo", "path": str(served), "bind": "127.0.0.1", "run_dir": str(run_dir)}
    result = arena.module("weights_server", args, timeout=FIFO_TIMEOUT)
    assert not result.timed_out, f"weights_server start blocked on a FIFO: {result!r}"
    assert result.failed, f"a FIFO manifest lists nothing that could be served: {result!r}"
    arena.assert_victims_intact()


# ---------------------------------------------------------------------------
# 7. Kernel caches from a peer were served by `python3 -m http.server` over the whole spool, with no token.


@pytest.mark.broke(7)
def test_case07_no_plain_http_server_in_roles_or_plugins():
    pattern = re.compile(r"-m\s+http\.server|SimpleHTTPRequestHandler")
    found = []
    for top in ("roles", "plugins"):
        for path in sorted((CHECKOUT / top).rglob("*")):
            if path.is_file() and path.suffix in (".yml", ".yaml", ".py", ".j2", ".sh"):
                for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    if pattern.search(line) and not line.lstrip().startswith("#"):
                        found.append(f"{path.relative_to(CHECKOUT)}:{number}: {line.strip()}")
    assert found == [], "a plain http.server still serves files:\n" + "\n".join(found)


@pytest.mark.broke(7)
def test_case07_kernel_peer_needs_token_and_lists_only_entries(arena):
    """The kernel peer goes through weights_server (kind kernels): token required, only store entries served.

    Written against the interface of the fix (weights_server option ``kind: kernels`` serving a kernel store
    spool); the code before the fix has no such option and fails here.
    """
    spool = arena.private / "spool"
    entry = build_kernel_entry(spool, kernel_key(), [tar_member("blob", data=b"kernel\n")])
    (spool / "stray.txt").write_text(f"{arena.secret} not a store entry\n")
    (entry / "notes.txt").write_text(f"{arena.secret} not an entry file\n")
    os.symlink(arena.victim, entry.parent / "linked")
    with weights_server(arena, spool, name="kernels", kind="kernels") as started:
        assert not started.failed and not started.timed_out, started
        url = started["url"]
        host, port = re.match(r"^http://([^/:]+):(\d+)/", url).groups()
        token_path = url.split(f":{port}", 1)[1]
        rel_entry = entry.relative_to(spool).as_posix()
        answers = {}
        for path in (
            f"{token_path}{rel_entry}/manifest.json",
            f"/{rel_entry}/manifest.json",
            f"/{rel_entry}/kernels.tar.zst",
            "/stray.txt",
            f"{token_path}stray.txt",
            f"{token_path}{rel_entry}/notes.txt",
            f"{token_path}{entry.parent.relative_to(spool).as_posix()}/linked",
            f"{token_path}{rel_entry}/../../../../../../stray.txt",
        ):
            conn = http.client.HTTPConnection(host, int(port), timeout=5)
            conn.request("GET", path)
            resp = conn.getresponse()
            answers[path] = (resp.status, resp.read())
            conn.close()
    good = answers.pop(f"{token_path}{rel_entry}/manifest.json")
    assert good[0] == 200 and b"ttfleet.kernel_cache" in good[1], f"the entry's manifest was not served: {good}"
    for path, (status, body) in answers.items():
        if not path.startswith(token_path):
            assert status == 404, f"{path} (no token) answered {status}"
        assert status in (403, 404), f"{path} answered {status}"
        assert arena.secret.encode() not in body, path
    arena.assert_victims_intact()


# ---------------------------------------------------------------------------
# 8. A comma in a spec's model_name reached `docker --mount type=bind,src=...` as mount options.


def _spec_file(arena, mutate, name="spec.json"):
    """A one-model spec export (Qwen3-32B on P300X2 of TTIS v0.20.0) changed by ``mutate(spec)``."""
    with gzip.open(CHECKOUT / "tests" / "fixtures" / "specs" / "release_model_spec-v0.20.0.json.gz") as handle:
        data = json.load(handle)
    spec = data["model_specs"]["Qwen/Qwen3-32B"]["P300X2"]["vLLM"]["tt_transformers"]
    mutate(spec)
    one = {
        "schema_version": data["schema_version"],
        "release_version": data["release_version"],
        "model_specs": {"Qwen/Qwen3-32B": {"P300X2": {"vLLM": {"tt_transformers": spec}}}},
    }
    path = arena.private / name
    path.write_text(json.dumps(one))
    return path


def _container_command(arena, spec_file):
    return arena.module(
        "container_command",
        {"model": "Qwen/Qwen3-32B", "device": "p300x2", "spec_file": str(spec_file), "volume_root": str(arena.root)},
    )


def test_case08_control_spec_is_accepted(arena):
    """The unmodified spec gives a command: the refusals below are about the hostile values."""
    result = _container_command(arena, _spec_file(arena, lambda spec: None))
    assert not result.failed, result
    assert f"type=bind,src={arena.volume},dst=/home/container_app_user/cache_root" in result["argv"], result


@pytest.mark.broke(8)
@pytest.mark.parametrize(
    "value",
    ["Qwen3-32B,readonly,bind-propagation=rshared", "Qwen3-32B\nExecStartPre=/bin/true"],
    ids=["comma", "newline"],
)
def test_case08_spec_model_name_reaching_mount_options(arena, value):
    spec_file = _spec_file(arena, lambda spec: spec.update(model_name=value))
    result = _container_command(arena, spec_file)
    assert not result.timed_out, result
    mounts = [arg for arg in result.get("argv") or [] if arg.startswith("type=bind")]
    assert result.failed, f"container_command accepted model_name {value!r}; its mounts: {mounts}"
    msg = result.get("msg", "")
    named = value in msg or repr(value)[1:-1] in msg
    assert str(spec_file) in msg and "model_name" in msg and named, (
        f"the error must name the spec file, the field and the value: {msg!r}"
    )


# ---------------------------------------------------------------------------
# 9. A newline in serve_hugepages_mount_unit (a plain str argument) added directives to the rendered unit.


def _serve_assert_play(arena, value):
    """ansible-playbook on localhost running only the serve role's checks, for a good and a hostile value."""
    inventory = arena.private / "inventory.yml"
    inventory.write_text(
        json.dumps(
            {
                "all": {
                    "hosts": {
                        "good": {"serve_hugepages_mount_unit": "dev-hugepages\\x2d1G.mount"},
                        "bad": {"serve_hugepages_mount_unit": value},
                    },
                    "vars": {"ansible_connection": "local", "ansible_python_interpreter": PYTHON},
                }
            }
        )
    )
    play = arena.private / "play.yml"
    play.write_text(
        "- hosts: all\n  gather_facts: false\n  vars: {tt_models: [], tt_device: p300x2}\n"
        "  tasks:\n    - ansible.builtin.import_role:\n        name: ttfleet.inference.serve\n"
    )
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_HOME": str(arena.private / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(arena.private / "ansible-tmp"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }
    playbook = Path(PYTHON).with_name("ansible-playbook")
    proc = subprocess.run(
        [str(playbook), "-i", str(inventory), str(play), "--check", "--tags", "serve_assert"],
        cwd=arena.private,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc


@pytest.mark.broke(9)
def test_case09_newline_in_hugepages_mount_unit(arena):
    value = "dev-hugepages\\x2d1G.mount\nExecStartPre=/bin/touch /tmp/pwned"
    proc = _serve_assert_play(arena, value)
    out = proc.stdout + proc.stderr
    recap = dict(re.findall(r"^(good|bad)\s*:\s*(.*)$", out, re.M))
    assert "failed=0" in recap.get("good", ""), f"the default value must pass the checks:\n{out[-3000:]}"
    assert "failed=1" in recap.get("bad", ""), f"a newline in serve_hugepages_mount_unit was accepted:\n{out[-3000:]}"
    failure = "\n".join(line for line in out.splitlines() if "bad" in line and "FAILED" in line)
    assert "serve_hugepages_mount_unit" in failure, f"the error must name the variable:\n{out[-3000:]}"


# ---------------------------------------------------------------------------
# 10. Malformed specs and env files gave bare errors; .stats was 0644; credentials in endpoint URLs showed.


@pytest.mark.broke(10)
@pytest.mark.parametrize(
    ("field", "mutate"),
    [
        ("impl_id", lambda spec: spec["impl"].pop("impl_id")),
        ("hf_model_repo", lambda spec: spec.pop("hf_model_repo")),
        ("env_vars", lambda spec: spec.update(env_vars=["MESH_DEVICE=P300x2"])),
    ],
    ids=["no-impl_id", "no-hf_model_repo", "env_vars-list"],
)
def test_case10_malformed_spec_names_file_and_key(arena, field, mutate):
    spec_file = _spec_file(arena, mutate)
    result = _container_command(arena, spec_file)
    assert not result.timed_out, result
    assert result.failed, f"a spec with a broken {field} was accepted: {result!r}"
    msg = result.get("msg", "")
    assert str(spec_file) in msg and field in msg, f"the error must name the spec file and {field}: {msg!r}"
    assert not re.fullmatch(r"'?\w+'?", msg.strip()), msg


@pytest.mark.broke(10)
def test_case10_non_utf8_env_file_names_the_file(arena):
    env_file = arena.private / "tt-qwen3-32b-p300x2.env"
    env_file.write_bytes(b"VLLM_API_KEY=abc\xff\xfe\nHF_TOKEN=x\n")
    os.chmod(env_file, 0o600)
    result = arena.module("serve_env", {"path": str(env_file), "engine": "vLLM"})
    assert not result.timed_out, result
    assert result.failed, result
    msg = result.get("msg", "")
    assert str(env_file) in msg, f"the error must name the env file: {msg!r}"
    assert "Traceback" not in result.stderr, result.stderr[-2000:]


@pytest.mark.broke(10)
def test_case10_weights_server_state_files_private(arena):
    served = arena.volume / "weights" / MODEL
    arena.write(served / "config.json", WEIGHTS["config.json"])
    arena.write(
        served / ".ttfleet-manifest.json", json.dumps(weights_manifest({"config.json": WEIGHTS["config.json"]}))
    )
    run_dir = arena.private / "run"
    with weights_server(arena, served, name="stats") as started:
        assert not started.failed, started
        host, port = re.match(r"^http://([^/:]+):(\d+)/", started["url"]).groups()
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        conn.request("GET", started["url"].split(f":{port}", 1)[1] + "config.json")
        assert conn.getresponse().read() == WEIGHTS["config.json"]
        conn.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(p.name.endswith(".stats") for p in run_dir.iterdir()):
            time.sleep(0.1)
        files = sorted(p for p in run_dir.iterdir())
        assert any(p.name.endswith(".stats") for p in files), f"no .stats file after a request: {files}"
        for path in files:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and started["url"].split("/")[-2] in path.read_text(errors="replace"):
                assert stat.S_IMODE(st.st_mode) & 0o077 == 0, f"{path} holds the token URL with mode {st.st_mode:o}"
        assert stat.S_IMODE(os.stat(run_dir).st_mode) & 0o077 == 0


@pytest.mark.broke(10)
@pytest.mark.parametrize("module", ["kernel_cache", "model_weights"])
def test_case10_credentials_in_endpoint_url(arena, module):
    password = "Pw-" + arena.secret
    endpoint = f"http://ak:{password}@127.0.0.1:9/"
    common = {"s3_endpoint": endpoint, "s3_bucket": "b", "s3_access_key": "AK", "s3_secret_key": "SK"}
    if module == "kernel_cache":
        args = kernel_args(arena, "deployed", store="s3", **common)
    else:
        args = {
            "dest": str(arena.volume / "weights" / MODEL),
            "source": "s3",
            "repo_id": "Qwen/Qwen3-32B",
            "revision": "a" * 40,
            "timeout": 3,
            **common,
        }
    result = arena.module(module, args)
    assert not result.timed_out, result
    assert result.failed, f"{module} accepted an endpoint URL with credentials: {result!r}"
    where = [
        name
        for name, text in (
            ("its message", str(result.get("msg"))),
            ("invocation.module_args (what -vvv prints)", json.dumps(result.get("invocation"))),
            ("its output", result.stdout + result.stderr),
        )
        if password in text
    ]
    assert not where, f"{module} showed the password of the endpoint URL in {', '.join(where)}"
