"""Fault-injection cases: each injects a fault on lab hosts for real, runs the real playbook or role, checks it.

The fast half (CI: `tests/run-tests.sh faults`) runs the model_cache role on one n150 lab host; the cases marked
slow (TTFLEET_FAULTS=all, `make faults`) converge two hosts with site.yml and roll upgrades over them, or fan a kernel
cache out over three hosts with one holder killed mid-archive (two minutes; the resume itself is in tests/hostile,
which CI runs). The token-leak
scan comes last and reads every log the cases before it produced.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import time

import lab as labmod
import pytest
from conftest import (
    GATED_REPO,
    HOST_SPEC,
    HOST_WMEM,
    LOGS,
    MODEL_REPO,
    OUT,
    PLAYBOOKS,
    ROOT,
    VARS,
    finish_playbook,
    host_sh,
    log,
    read_log,
    run_playbook,
    sh,
    start_playbook,
)
from conftest import file_gets as gets

pytestmark = pytest.mark.faults

HOST = "ft-n150-1"
MODEL = "Llama-3.2-1B-Instruct"
VOLUME = "volume_id_tt_transformers-Llama-3.2-1B-Instruct-v0.11.1"
MODEL_CACHE = os.path.join(PLAYBOOKS, "model_cache.yml")
IMAGE = "vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.11.1-84b4c53-222ee06"
SITE = os.path.join(ROOT, "playbooks", "site.yml")
UPGRADE = os.path.join(ROOT, "playbooks", "upgrade.yml")


def model_vars(lab, root, models=None, **extra):
    data = {
        "model_cache_spec_file": HOST_SPEC,
        "model_cache_sources": ["hf"],
        "model_cache_disk_margin_gb": 0,
        "model_cache_peers": False,
        "tt_volume_root": root,
        "tt_preseeded_roots": [],
        "tt_models": models
        if models is not None
        else [{"name": MODEL, "revision": lab.mirror["revisions"][MODEL_REPO]}],
    }
    data.update(extra)
    return data


def fetched_files(lab, repo=MODEL_REPO):
    """Files the role fetches (the ignore pattern original/** leaves the .pth out) and their sizes and digests."""
    return {k: v for k, v in lab.models[repo]["files"].items() if not k.startswith("original/")}


def host_sha256(host, directory):
    """``{relative path: sha256}`` of every regular file under ``directory`` on a host (hidden files included)."""
    out = host_sh(host, f"cd {directory} 2>/dev/null && find . -type f -print0 | xargs -0 -r sha256sum", check=False)
    sums = {}
    for line in out.stdout.splitlines():
        digest, _sep, path = line.partition("  ")
        sums[path[2:]] = digest
    return sums


def shape_link(host, shaped=True, to=None, rate="2mbit"):
    """Slow ``host``'s outgoing link to ``rate`` (``shaped=False`` restores it): all of it, or with ``to`` (another
    lab host) only what goes to that host, so that the earlier rounds of a fan-out stay fast. The fault suite's hosts
    start with small TCP send buffers (conftest.HOST_WMEM), checked here: with the kernel's default (autotuned up to
    4 MiB) the rest of a lab-sized file may already sit in the socket when a holder's server is killed, and the kernel
    delivers it after the kill, so the pull ends without a failure to hand over."""
    if not shaped:
        host_sh(host, "tc qdisc del dev eth0 root", check=False)
        return
    wmem = host_sh(host, "cat /proc/sys/net/ipv4/tcp_wmem").stdout.split()
    assert wmem == HOST_WMEM.split(), f"{host}'s send buffers are {wmem}, not {HOST_WMEM}: a kill would not cut"
    tbf = f"tbf rate {rate} burst 32kbit latency 400ms"
    if to is None:
        host_sh(host, f"tc qdisc replace dev eth0 root {tbf}")
        return
    # An htb qdisc whose class 1:20 (shaped) takes only the packets to ``to``; the rest goes out through 1:10, unshaped.
    # (This machine's kernel has htb and tbf but not prio or netem.)
    host_sh(
        host,
        "set -e; tc qdisc replace dev eth0 root handle 1: htb default 10; "
        "tc class add dev eth0 parent 1: classid 1:10 htb rate 10gbit; "
        f"tc class add dev eth0 parent 1: classid 1:20 htb rate {rate} ceil {rate}; "
        f"tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst {labmod.host_address(to)}/32 "
        "flowid 1:20",
    )


def shaped_bytes(host):
    """The bytes the shaped class of ``shape_link(host, to=...)`` has sent so far."""
    out = host_sh(host, "tc -s class show dev eth0 classid 1:20", check=False).stdout
    found = re.search(r"Sent (\d+) bytes", out)
    return int(found.group(1)) if found else -1


def wait_for_part(host, directory, min_bytes=100_000, timeout=120, pattern="*"):
    """Wait for a partly downloaded file (``<pattern>.ttfleet-part``) of at least ``min_bytes`` in ``directory``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = (
            host_sh(
                host,
                f"find {directory} -name '{pattern}.ttfleet-part' -size +{min_bytes // 1024}k "
                "-printf '%s %p\\n' 2>/dev/null",
                check=False,
            )
            .stdout.split("\n")[0]
            .strip()
        )
        if out:
            size, path = out.split(" ", 1)
            return int(size), path
        time.sleep(0.2)
    raise AssertionError(f"no partial download under {directory} within {timeout} s")


def kill_downloads(host):
    """kill -9 the model_weights job on the host, as a crash or reboot would; returns the pids killed."""
    pids = host_sh(host, "pgrep -f '[A]nsiballZ_model_weights' || true").stdout.split()
    assert pids, "the download had already finished: nothing to interrupt"
    host_sh(host, f"kill -9 {' '.join(pids)}")
    return pids


def origin_offset(lab):
    return len(read_log(lab.origin_log))


# ---------------------------------------------------------------------------
# Inputs refused


@pytest.mark.case("unknown model / device / impl")
@pytest.mark.parametrize(
    ("what", "entry", "extra", "named", "choices"),
    [
        ("model", {"name": "No-Such-Model-7B"}, {}, "No-Such-Model-7B", ["Llama-3.2-1B-Instruct"]),
        ("device", {"name": MODEL}, {"tt_device": "n151"}, "n151", ["n150", "p300x2"]),
        ("impl", {"name": MODEL, "impl": "no-such-impl"}, {}, "no-such-impl", ["tt-transformers"]),
    ],
    ids=["model", "device", "impl"],
)
def test_unknown_input(lab, case, what, entry, extra, named, choices):
    case.expected = f"fails naming the {what} {named!r} and the valid choices ({', '.join(choices)}, ...)"
    entry = dict(entry, revision=lab.mirror["revisions"][MODEL_REPO])
    run = run_playbook(
        f"unknown-{what}", MODEL_CACHE, model_vars(lab, f"/srv/ft-unknown-{what}", [entry], **extra), limit=HOST
    )
    messages = " ".join(run.messages())
    case.observed = f"rc {run.rc}: {messages[:300]}"
    assert run.rc != 0, "the run accepted an unknown input"
    assert named in messages, f"the error does not name {named!r}"
    for choice in choices:
        assert choice in messages, f"the error does not list the valid choice {choice!r}"


@pytest.mark.case("hostile model name")
@pytest.mark.parametrize(
    "name",
    ["../../etc", "Llama-3.2-1B;touch${IFS}.ft-pwned", "Llama-3.2-1B\nInjected: 1", "$(touch /tmp/ft-pwned)"],
    ids=["traversal", "shell-metachar", "newline", "command-substitution"],
)
def test_hostile_model_name(lab, case, name):
    tag = hashlib.sha256(name.encode()).hexdigest()[:8]
    root = f"/srv/ft-hostile-{tag}"
    case.expected = "refused naming the input; nothing written (no volume root, no file outside it, no command run)"
    before = host_sh(HOST, "find /etc /srv /var/lib /tmp -xdev -newer /etc/hostname 2>/dev/null | sort").stdout
    run = run_playbook(
        f"hostile-{tag}",
        MODEL_CACHE,
        model_vars(lab, root, [{"name": name, "revision": lab.mirror["revisions"][MODEL_REPO]}]),
        limit=HOST,
    )
    messages = " ".join(run.messages())
    after = host_sh(HOST, "find /etc /srv /var/lib /tmp -xdev -newer /etc/hostname 2>/dev/null | sort").stdout
    new = sorted(set(after.splitlines()) - set(before.splitlines()))
    # Ansible's own temporary files come and go; nothing else may appear.
    new = [path for path in new if not re.match(r"^/(root|tmp)/\.ansible", path) and "ansible-tmp" not in path]
    found = host_sh(HOST, "find / -xdev -name '*ft-pwned*' 2>/dev/null | head -1", check=False).stdout.strip()
    pwned = "yes" if found else "no"
    case.observed = f"rc {run.rc}; new paths {new or 'none'}; command ran: {pwned}; message: {messages[:220]}"
    assert run.rc != 0, "a hostile model name was accepted"
    assert pwned == "no", "a shell command from the model name ran on the host"
    assert json.dumps(name) in messages, "the error does not name the input"
    assert new == [], f"the refused run wrote {new}"


@pytest.mark.case("gated repo without a token")
def test_gated_repo_without_token(lab, case):
    case.expected = (
        "fails naming the repository, HTTP 401 and hf_token, nothing in the volume; with the token the same run "
        "fetches the model"
    )
    rev = lab.mirror["revisions"][GATED_REPO]
    root = "/srv/ft-gated"
    models = [{"name": "Llama-3.2-1B", "revision": rev}]
    run = run_playbook(
        "gated-no-token",
        MODEL_CACHE,
        model_vars(lab, root, models, model_cache_hf_endpoint=lab.gated_endpoint),
        limit=HOST,
    )
    messages = " ".join(run.messages())
    left = host_sh(HOST, f"find {root} -type f 2>/dev/null | wc -l").stdout.strip()
    with_token = run_playbook(
        "gated-token",
        MODEL_CACHE,
        model_vars(lab, root, models, model_cache_hf_endpoint=lab.gated_endpoint, model_cache_hf_token=lab.hf_token),
        limit=HOST,
    )
    weights = host_sha256(HOST, f"{root}/volume_id_tt_transformers-Llama-3.2-1B-v0.11.1/weights/Llama-3.2-1B")
    expected = {k: v["sha256"] for k, v in fetched_files(lab, GATED_REPO).items()}
    got = {k: weights.get(k) for k in expected}
    case.observed = (
        f"without token: rc {run.rc}, {left} files written, message: {messages[:260]}; with token: rc "
        f"{with_token.rc}, {sum(got[k] == expected[k] for k in expected)}/{len(expected)} files verified"
    )
    assert run.rc != 0
    assert GATED_REPO in messages and "HTTP 401" in messages and "hf_token" in messages, messages
    assert left == "0", f"{left} files written without access"
    assert with_token.rc == 0, with_token.messages()
    assert got == expected


# ---------------------------------------------------------------------------
# Downloads


@pytest.mark.case("corrupt shard")
def test_corrupt_shard(lab, case):
    root = "/srv/ft-corrupt"
    weights = f"{root}/{VOLUME}/weights/{MODEL}"
    shard = "model-00002-of-00002.safetensors"
    files = fetched_files(lab)
    case.expected = f"detected with model_cache_verify=sha256; only {shard} ({files[shard]['size']} B) read again"
    first = run_playbook("corrupt-converge", MODEL_CACHE, model_vars(lab, root), limit=HOST)
    assert first.rc == 0, first.messages()
    host_sh(
        HOST,
        f'python3 -c \'import sys; f = open(sys.argv[1], "r+b"); f.seek(4096); b = f.read(1); f.seek(4096); '
        f"f.write(bytes([b[0] ^ 0xFF])); f.close()' {weights}/{shard}",
    )
    assert host_sha256(HOST, weights)[shard] != files[shard]["sha256"], "the injected corruption did not stick"
    offset = origin_offset(lab)
    run = run_playbook("corrupt-repair", MODEL_CACHE, model_vars(lab, root, model_cache_verify="sha256"), limit=HOST)
    refetched = gets(read_log(lab.origin_log)[offset:])
    sums = host_sha256(HOST, weights)
    good = sum(sums.get(k) == v["sha256"] for k, v in files.items())
    case.details = {"refetched": refetched}
    case.observed = f"rc {run.rc}; read from the origin: {refetched}; {good}/{len(files)} files match the Hub"
    assert run.rc == 0, run.messages()
    assert refetched == {shard: files[shard]["size"]}
    assert good == len(files)


@pytest.mark.case("interrupted download resumed")
def test_interrupted_download(lab, case):
    root = "/srv/ft-resume"
    weights = f"{root}/{VOLUME}/weights/{MODEL}"
    files = fetched_files(lab)
    total = sum(v["size"] for v in files.values())
    smallest_shard = min(v["size"] for k, v in files.items() if k.endswith(".safetensors"))
    case.expected = "the re-run completes the model; bytes read twice from the origin < one file (a shard)"
    slow_offset = len(read_log(lab.slow_log))
    offset = origin_offset(lab)
    proc = start_playbook(
        "resume-interrupted",
        MODEL_CACHE,
        model_vars(lab, root, model_cache_hf_endpoint=lab.slow_endpoint),
        limit=HOST,
    )
    try:
        # Interrupted in the second shard: resuming must not read the first one (complete, staged) again.
        part_bytes, part = wait_for_part(HOST, f"{root}/{VOLUME}/weights", pattern="model-00002-*")
        pids = kill_downloads(HOST)
        log(f"killed the download ({pids}) with {part_bytes} B of {os.path.basename(part)} staged")
    finally:
        interrupted = finish_playbook(proc, kill=True)
    time.sleep(1)  # the slow proxy logs a request when its client went away
    resumed = run_playbook("resume-again", MODEL_CACHE, model_vars(lab, root), limit=HOST)
    first = gets(read_log(lab.slow_log)[slow_offset:])
    second = gets(read_log(lab.origin_log)[offset:])
    both = {k: first.get(k, 0) + second.get(k, 0) for k in set(first) | set(second)}
    read = sum(both.values())
    twice = read - total
    sums = host_sha256(HOST, weights)
    good = sum(sums.get(k) == v["sha256"] for k, v in files.items())
    case.details = {"interrupted_run": first, "resumed_run": second, "model_bytes": total, "read_twice": twice}
    case.observed = (
        f"killed with {part_bytes} B of {os.path.basename(part).removesuffix('.ttfleet-part')} staged "
        f"(first run rc {interrupted.rc}); re-run rc {resumed.rc}, {good}/{len(files)} files verified; origin "
        f"bytes {read} for a {total} B model: {twice} B read twice (smallest shard {smallest_shard} B)"
    )
    assert resumed.rc == 0, resumed.messages()
    assert good == len(files)
    assert set(both) == set(files), f"files read: {sorted(both)}"
    assert 0 <= twice < smallest_shard, f"{twice} B read twice"
    for name, size in both.items():
        if name not in first or first[name] == files[name]["size"]:
            assert size == files[name]["size"], f"{name} was read again in full after it was complete"


@pytest.mark.case("disk full during a download")
def test_disk_full(lab, case):
    root = "/srv/ft-small/volumes"
    files = fetched_files(lab)
    total = sum(v["size"] for v in files.values())
    case.expected = (
        "preflight passes, the filesystem fills while the shards stream: the run fails naming host, path, bytes "
        "needed and free; no partial file left in the volume"
    )
    host_sh(
        HOST,
        "umount /srv/ft-small 2>/dev/null; mkdir -p /srv/ft-small && mount -t tmpfs -o size=4m tmpfs /srv/ft-small",
    )
    try:
        proc = start_playbook(
            "disk-full", MODEL_CACHE, model_vars(lab, root, model_cache_hf_endpoint=lab.slow_endpoint), limit=HOST
        )
        try:
            wait_for_part(HOST, root, min_bytes=150_000)
            # Another writer fills the filesystem while the download runs.
            host_sh(
                HOST,
                "dd if=/dev/zero of=/srv/ft-small/filler bs=64k 2>/dev/null; sync; df -B1 /srv/ft-small",
                check=False,
            )
        finally:
            run = finish_playbook(proc, timeout=300)
        messages = " ".join(run.messages())
        leftovers = host_sh(HOST, f"find {root} -type f 2>/dev/null").stdout.split()
        case.observed = f"rc {run.rc}; files left in the volume: {leftovers or 'none'}; message: {messages[:360]}"
        case.details = {"model_bytes": total, "leftovers": leftovers}
        assert run.rc != 0, "the download succeeded on a full filesystem"
        assert HOST in messages and "/srv/ft-small" in messages, messages
        assert re.search(r"need", messages) and re.search(r"free", messages), messages
        assert re.search(r"\d+ bytes", messages), "the message gives no byte counts"
        partial = [path for path in leftovers if path.endswith(".ttfleet-part") or "/weights/" in path]
        assert partial == [], f"partial files left in the volume: {partial}"
    finally:
        host_sh(HOST, "umount /srv/ft-small", check=False)


@pytest.mark.case("holder killed mid-round")
def test_holder_killed_mid_round(lab, case):
    """Three hosts fan a model out in two rounds (the seed, then one puller, then one more from the seed with the
    first puller as its alternate). The seed's link is shaped so that the round-2 pull is still running when the
    seed's peer servers are killed (kill -9): the puller must finish from the other holder, resuming its cut file,
    with every file verified and the origin read once."""
    root = "/srv/ft-fanout"
    extra = {"ft-fan-2": "n150", "ft-fan-3": "n150"}
    case.expected = "the puller finishes from the other holder; all files verified on 3 hosts; origin read once"
    lab.add_hosts(extra)
    # The inventory lists the hosts sorted: the first is the seed, the second pulls in round 1, the third in round 2.
    seed, first, second = sorted([HOST, *extra])
    files = fetched_files(lab)
    total = sum(v["size"] for v in files.values())
    weights = f"{root}/{VOLUME}/weights"
    offset = origin_offset(lab)
    try:
        extra_vars = model_vars(lab, root, model_cache_peers=True)
        hosts = ",".join([seed, first, second])
        # --check --diff shows each host's holder and round, and for a holder whom it serves.
        planned = run_playbook("fanout-plan", MODEL_CACHE, extra_vars, limit=hosts, check=True)
        assert planned.rc == 0, planned.messages()
        plan_lines = re.findall(r'"(' + re.escape(MODEL) + r': [^"]*)"', planned.out)
        assert any(f"peer:{seed}," in line and "; round 1 of the fan-out, the origin last" in line
                   for line in plan_lines), plan_lines  # fmt: skip
        assert any(f"peer:{seed}," in line and f"; round 2 of the fan-out, then from {first}, the origin last" in line
                   for line in plan_lines), plan_lines  # fmt: skip
        assert any(f"; serves {first}, {second} in rounds 1, 2" in line for line in plan_lines), plan_lines
        # Round 1 (to the first puller) runs unshaped; what the seed sends to the second puller goes at 1 Mbit/s, so
        # the round-2 pull takes about 25 s and the kill below cuts it with most of the model still to come.
        shape_link(seed, to=second, rate="1mbit")
        proc = start_playbook("fanout-holder-killed", MODEL_CACHE, extra_vars, limit=hosts)
        started = time.monotonic()
        try:
            part_bytes, part = wait_for_part(second, weights, timeout=300)
            sent_before = shaped_bytes(seed)
            killed = host_sh(
                seed,
                "for f in /run/ttfleet-weights/*.json; do python3 -c 'import json, sys; "
                'print(json.load(open(sys.argv[1]))["pid"])\' "$f"; done | xargs -r kill -9 && echo killed',
            ).stdout.strip()
            log(
                f"killed the peer servers of {seed} with {part_bytes} B of {os.path.basename(part)} on {second}, "
                f"{time.monotonic() - started:.1f} s after the start, {sent_before} B sent to {second} by then"
            )
        finally:
            run = finish_playbook(proc, timeout=600)
        sent_after = shaped_bytes(seed)
        sums = {
            host: host_sh(host, f"cd {weights}/{MODEL} && sha256sum -- {' '.join(sorted(files))}", check=False).stdout
            for host in (seed, first, second)
        }
        good = {host: sum(f"{v['sha256']}  {k}" in out for k, v in files.items()) for host, out in sums.items()}
        parts = {
            host: host_sh(host, f"find {root} -name '*.ttfleet-part' | wc -l").stdout.strip()
            for host in (seed, first, second)
        }
        read = sum(gets(read_log(lab.origin_log)[offset:]).values())
        handed = re.findall(r"came from (http://[^ ]+) after (\d+) failed holder", run.out)
        case.details = {
            "files_verified": good,
            "part_files": parts,
            "origin_bytes": read,
            "model_bytes": total,
            "handed_over": handed,
            "shaped_bytes_at_kill": sent_before,
            "shaped_bytes_at_end": sent_after,
        }
        case.observed = (
            f"seed {seed}'s servers killed ({killed}) with {part_bytes} B of "
            f"{os.path.basename(part).removesuffix('.ttfleet-part')} on {second}; rc {run.rc}; files verified "
            f"{good}; part files left {parts}; {second} finished from {handed}; origin bytes {read} for a {total} B "
            f"model; the seed sent {second} {sent_before} B before the kill, {sent_after} B in all"
        )
        assert run.rc == 0, run.messages()
        assert all(count == len(files) for count in good.values()), good
        assert set(parts.values()) == {"0"}, parts
        # The seed must not have sent the model to the second puller: the kill came while the pull ran.
        assert 0 < sent_after < total, f"the seed sent {sent_after} B to {second} (of {total}); killed: {killed!r}"
        pulls = [line for line in run.out.splitlines() if "came from" in line or "failed" in line]
        assert len(handed) == 1 and handed[0][1] == "1", f"no hand-over to another holder in the output: {pulls}"
        assert read == total, f"the origin sent {read} B for a {total} B model"
    finally:
        shape_link(seed, shaped=False)
        host_sh(HOST, f"rm -rf {root}", check=False)
        lab.remove_hosts(extra)


KERNEL_KEY = {
    "model_name": MODEL,
    "mesh": "N150",
    "impl_id": "tt_transformers",
    "tt_metal_commit": "84b4c53",
    "vllm_commit": "222ee06",
}
KERNEL_SPOOL = "/var/cache/ttfleet/kernel-store"


@pytest.mark.slow
@pytest.mark.case("kernel holder killed mid-archive")
def test_kernel_holder_killed_mid_archive(lab, case):
    """A kernel peer and two hosts that pull its cache in two rounds (the first puller keeps the verified archive and
    serves it in round 2). The peer's link is shaped so that the round-2 pull is still streaming when the peer's
    servers are killed (kill -9): the puller must take only the rest of the archive from the other holder (a Range
    from the byte where the peer stopped), and put in place a cache identical to the peer's."""
    root = "/srv/ft-kfan"
    extra = {"ft-kfan-2": "n150", "ft-kfan-3": "n150"}
    case.expected = (
        "the puller resumes the archive from the other holder at the byte where the peer stopped; the cache in place "
        "is the peer's, file by file; no staging or temporary file left"
    )
    lab.add_hosts(extra)
    # The kernel peer comes first in the fan-out; then the other hosts in inventory order: round 1, round 2.
    peer, (first, second) = HOST, sorted(extra)
    cache = f"{root}/{VOLUME}/tt_metal_cache/cache_{MODEL}/N150"
    try:
        weights = run_playbook("kfan-weights", MODEL_CACHE, model_vars(lab, root), limit=peer)
        assert weights.rc == 0, weights.messages()
        # LAB STAND-IN for a warm-up: 2.5 MiB of compiled kernels and tensor cache (random, so zstd cannot shrink it).
        host_sh(
            peer,
            f"set -e; for k in a b c d; do mkdir -p {cache}/kernels/$k; "
            f"head -c 393216 /dev/urandom > {cache}/kernels/$k/brisc.elf; done; mkdir -p {cache}/tensor_cache; "
            f"head -c 1048576 /dev/urandom > {cache}/tensor_cache/w.tensorbin; "
            f"chown -R 1000:1000 {root}/{VOLUME}/tt_metal_cache; "
            f"find {root}/{VOLUME}/tt_metal_cache -exec touch -h -d '2 hours ago' {{}} +",
        )
        harvest = run_playbook(
            "kfan-harvest",
            os.path.join(PLAYBOOKS, "kernel_harvest.yml"),
            {"ft_volume": f"{root}/{VOLUME}", "ft_kernel_key": KERNEL_KEY},
            limit=peer,
        )
        assert harvest.rc == 0, harvest.messages()
        extra_vars = model_vars(
            lab,
            root,
            model_cache_kernel_store="peer",
            model_cache_kernel_peer=peer,
            model_cache_kernel_required=True,
        )
        hosts = ",".join([peer, first, second])
        shape_link(peer)
        proc = start_playbook("kfan-holder-killed", MODEL_CACHE, extra_vars, limit=hosts)
        try:
            part = wait_for_kept_part(second, timeout=300)
            killed = host_sh(
                peer,
                "for f in /run/ttfleet-weights/*.json; do python3 -c 'import json, sys; "
                'print(json.load(open(sys.argv[1]))["pid"])\' "$f"; done | xargs -r kill -9 && echo killed',
            ).stdout.strip()
            log(f"killed the kernel servers of {peer} with {part} B of the archive kept on {second}")
        finally:
            run = finish_playbook(proc, timeout=600)
        want = host_sha256(peer, cache)
        got = {host: host_sha256(host, cache) for host in (first, second)}
        leftovers = {
            host: host_sh(
                host, f"find {root} {KERNEL_SPOOL} -name '.ttfleet-tmp-*' -o -name '*.ttfleet-part' | wc -l"
            ).stdout.strip()
            for host in (first, second)
        }
        resumed = re.findall(
            r"came from (http://[^/]+)/\S*(?: path>\S*)? after (\d+) failed holder\(s\): .*?at byte (\d+) of (\d+)",
            run.out,
        )
        entry = f"{KERNEL_SPOOL}/{'/'.join(KERNEL_KEY.values())}"
        kept_ok = host_sh(second, f"cd {entry} && sha256sum -c kernels.tar.zst.sha256", check=False).returncode
        case.details = {"resumed": resumed, "leftovers": leftovers, "files": len(want), "kept_check_rc": kept_ok}
        case.observed = (
            f"{peer}'s servers killed ({killed}) with {part} B of the archive kept on {second}; rc {run.rc}; "
            f"{second} resumed {resumed}; cache files equal to the peer's: "
            f"{ {host: files == want for host, files in got.items()} } ({len(want)} files); kept archive check rc "
            f"{kept_ok}; staging or temporary files left {leftovers}"
        )
        assert run.rc == 0, run.messages()
        assert want and all(files == want for files in got.values()), (want, got)
        assert len(resumed) == 1 and resumed[0][1] == "1", f"no resume from another holder in the output: {resumed}"
        assert 0 < int(resumed[0][2]) < int(resumed[0][3]), resumed
        assert kept_ok == 0 and set(leftovers.values()) == {"0"}, (kept_ok, leftovers)
    finally:
        shape_link(peer, shaped=False)
        host_sh(HOST, f"rm -rf {root} {KERNEL_SPOOL}", check=False)
        lab.remove_hosts(extra)


def wait_for_kept_part(host, min_bytes=262144, timeout=120):
    """Wait until the archive a deploy keeps for its peers (a temporary file in the spool) holds ``min_bytes``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = host_sh(
            host,
            f"find {KERNEL_SPOOL} -name '.ttfleet-tmp-*' -size +{min_bytes // 1024}k -printf '%s\\n' 2>/dev/null",
            check=False,
        ).stdout.split()
        if out:
            return int(out[0])
        time.sleep(0.2)
    raise AssertionError(f"no archive streaming into {KERNEL_SPOOL} on {host} within {timeout} s")


# ---------------------------------------------------------------------------
# Volumes


@pytest.mark.case("real directory where an alias must go")
def test_real_directory_at_alias(lab, case):
    seed, root = "/srv/ft-alias-seed", "/srv/ft-alias"
    old = f"{seed}/volume_id_tt_transformers-{MODEL}-v0.10.0"
    expected_path = f"{root}/{VOLUME}"
    case.expected = (
        "the role refuses to replace the real directory (or moves it aside); volume_alias force=false refuses, "
        "force=true renames it aside; every file of it intact"
    )
    host_sh(
        HOST,
        f"rm -rf {seed} {root} && mkdir -p {old}/weights/{MODEL} {expected_path}/tt_metal_cache/cache_{MODEL}/N150 && "
        f"cd {old}/weights/{MODEL} && for f in model.safetensors tokenizer.json config.json; do echo seed $f > $f; "
        f"done && head -c 300000 /dev/urandom > {expected_path}/tt_metal_cache/cache_{MODEL}/N150/kernels.bin && "
        f"echo operator notes > {expected_path}/NOTES.txt && chown -R 1000:1000 {seed} {root}",
    )
    before = host_sha256(HOST, expected_path)
    role = run_playbook(
        "alias-role",
        MODEL_CACHE,
        model_vars(lab, root, [{"name": MODEL}], model_cache_sources=["preseeded"], tt_preseeded_roots=[seed]),
        limit=HOST,
    )
    role_msg = " ".join(role.messages())
    kind = host_sh(HOST, f"stat -c %F {expected_path}").stdout.strip()
    after_role = host_sha256(HOST, expected_path)
    refused = run_playbook(
        "alias-refused",
        os.path.join(PLAYBOOKS, "alias.yml"),
        {"ft_alias_path": expected_path, "ft_alias_src": old, "ft_alias_force": False},
        limit=HOST,
    )
    refused_msg = " ".join(refused.messages())
    after_refused = host_sha256(HOST, expected_path)
    forced = run_playbook(
        "alias-forced",
        os.path.join(PLAYBOOKS, "alias.yml"),
        {"ft_alias_path": expected_path, "ft_alias_src": old, "ft_alias_force": True},
        limit=HOST,
    )
    match = re.search(r'moved_aside\\?": \\?"([^"\\]+)', forced.out)
    aside = match.group(1) if match else ""
    after_forced = host_sha256(HOST, aside) if aside else {}
    link = host_sh(HOST, f"readlink {expected_path}", check=False).stdout.strip()
    case.observed = (
        f"role rc {role.rc} ({role_msg[:160]}), path still a {kind}, {len(after_role)}/{len(before)} files intact; "
        f"force=false rc {refused.rc} ({refused_msg[:120]}); force=true rc {forced.rc}, moved aside to "
        f"{os.path.basename(aside) or 'nothing'} with {sum(after_forced.get(k) == v for k, v in before.items())}"
        f"/{len(before)} files intact, link -> {link or 'none'}"
    )
    assert len(before) == 2
    assert kind == "directory" and after_role == before, "the role changed the real directory"
    assert role.rc != 0 and expected_path in role_msg, "the role neither used nor refused the directory clearly"
    assert refused.rc != 0 and "real directory" in refused_msg and after_refused == before
    assert forced.rc == 0 and aside and after_forced == before
    assert link.endswith(os.path.basename(old))


# ---------------------------------------------------------------------------
# Rollouts (slow: a served fleet)


@pytest.fixture(scope="session")
def served(lab):
    """ft-n150-1 and ft-n150-2 serving Llama-3.2-1B-Instruct with tt-inference-server v0.18.0 (site.yml)."""
    lab.add_host("ft-n150-2", "n150")
    images = [f"ghcr.io/tenstorrent/tt-inference-server/{IMAGE}"]

    # A cache directory of its own, under the lock every user of serve_image takes: its tarballs never replace the
    # ones of the lab or of a molecule scenario running beside it.
    labmod.SERVE_IMAGE_CACHE = os.path.join(OUT, "serve-image")
    with labmod.cache_lock("serve-image"):
        tarball = labmod.serve_image(images)
    for host in lab.hosts:
        host_sh(host, "mkdir -p /var/lib/ttfleet-lab")
        sh("docker", "cp", tarball, f"{host}:/var/lib/ttfleet-lab/serve-image.tar")
    run = run_playbook("site-v0.18.0", SITE, {"inference_server_version": "v0.18.0", "serve_start_timeout": 300})
    assert run.rc == 0, f"site.yml failed: {run.messages()[:3]}"
    return lab


def release_of(host):
    return host_sh(host, "readlink /opt/tt-inference-server/current", check=False).stdout.strip()


def health_of(host):
    state = json.loads(host_sh(host, "cat /var/lib/ttfleet/serve/*.json").stdout)
    code = host_sh(
        host, f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{state['port']}/health", check=False
    ).stdout.strip()
    return state, code


@pytest.mark.slow
@pytest.mark.case("failed upgrade rolled back")
def test_failed_upgrade_rolled_back(served, case):
    case.expected = (
        "upgrade to v0.25.0 (its n150 image predates the v0.11 container interface) fails on the canary, which is "
        "put back on v0.18.0 and serves; the other host is not touched; the message names host and reason"
    )
    before_2 = release_of("ft-n150-2")
    run = run_playbook(
        "upgrade-fails",
        UPGRADE,
        {"inference_server_version": "v0.25.0", "upgrade_serial": 1, "serve_start_timeout": 300},
    )
    messages = " ".join(run.messages())
    final = (run.messages() or [""])[-1]
    _state, code = health_of("ft-n150-1")
    rel_1, rel_2 = release_of("ft-n150-1"), release_of("ft-n150-2")
    case.observed = (
        f"rc {run.rc}; ft-n150-1 on {os.path.basename(rel_1)}, health {code}; ft-n150-2 on {os.path.basename(rel_2)} "
        f"(untouched: {rel_2 == before_2}); message: {final[:230]} ... {final[-130:]}"
    )
    assert run.rc != 0
    assert "ft-n150-1" in messages and "v0.25.0" in messages, messages
    assert re.search(r"(rolled back to|back on) v0\.18\.0", messages), messages
    assert rel_1.endswith("v0.18.0") and code == "200"
    assert rel_2 == before_2


@pytest.mark.slow
@pytest.mark.case("host unreachable mid-rollout")
def test_host_unreachable_mid_rollout(served, case):
    case.expected = (
        "ft-n150-2 stops during upgrade.yml (serial 2, upgrade_max_fail_percentage 50): it is reported unreachable "
        "(or, over the lab's pipelined docker connection, failed because its container is not running, named in the "
        "rollout's message), ft-n150-1 finishes the upgrade to v0.20.0 and serves"
    )
    proc = start_playbook(
        "upgrade-unreachable",
        UPGRADE,
        {
            "inference_server_version": "v0.20.0",
            "upgrade_serial": 2,
            "upgrade_max_fail_percentage": 50,
            "serve_start_timeout": 300,
        },
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with open(proc.ft_log, encoding="utf-8") as handle:
                if "TASK [ttfleet.inference.tt_host" in handle.read():
                    break
            time.sleep(0.5)
        sh("docker", "stop", "ft-n150-2")
        log("stopped ft-n150-2 mid-rollout")
    finally:
        run = finish_playbook(proc, timeout=1200)
    recap = run.recap()
    sh("docker", "start", "ft-n150-2")
    _state, code = health_of("ft-n150-1")
    rel_1 = release_of("ft-n150-1")
    case.observed = f"rc {run.rc}; recap {recap}; ft-n150-1 on {os.path.basename(rel_1)}, health {code}"
    gone = recap.get("ft-n150-2", {})
    # Over ssh a host that went away is unreachable. With pipelining, the docker connection runs a module as one
    # `docker exec`, whose "container is not running" comes back as the module's failure instead: then the failure of
    # that host must say so, and the rollout's own message must name the host.
    stopped = [
        result for host, result in run.failures() if host == "ft-n150-2" and "is not running" in json.dumps(result)
    ]
    named = [message for message in run.messages() if message.startswith("ft-n150-2: the upgrade to v0.20.0 failed")]
    assert gone.get("unreachable", 0) >= 1 or (gone.get("failed", 0) >= 1 and stopped and named), (recap, named)
    assert recap.get("ft-n150-1", {}).get("failed", 1) == 0, recap
    assert rel_1.endswith("v0.20.0") and code == "200"


# ---------------------------------------------------------------------------
# Secrets


@pytest.mark.case("token-leak scan")
def test_token_leak_scan(lab, case):
    secrets_ = list(lab.secrets)
    for host in lab.hosts:
        env = host_sh(host, "cat /etc/ttfleet/serve/*.env 2>/dev/null || true", check=False).stdout
        secrets_ += [
            line.split("=", 1)[1] for line in env.splitlines() if line.startswith(("VLLM_API_KEY=", "API_KEY="))
        ]
    case.expected = (
        "no secret value (HF token, API keys) in ansible output, fact cache, host journals, unit files, ps, async "
        "job files, state files, proxy logs"
    )
    texts = {}
    for path in glob.glob(os.path.join(LOGS, "*.log")) + glob.glob(os.path.join(OUT, "fact-cache", "*")):
        with open(path, encoding="utf-8", errors="replace") as handle:
            texts[os.path.relpath(path, ROOT)] = handle.read()
    for path in glob.glob(os.path.join(OUT, "**", "*"), recursive=True):
        if os.path.isfile(path) and path.endswith((".jsonl", ".log", ".out")) and not path.startswith(LOGS):
            with open(path, encoding="utf-8", errors="replace") as handle:
                texts[os.path.relpath(path, ROOT)] = handle.read()
    for host in lab.hosts:
        if sh("docker", "inspect", "-f", "{{.State.Running}}", host, check=False).stdout.strip() != "true":
            continue
        for what, script in {
            "journal": "journalctl --no-pager -o cat 2>/dev/null",
            "unit files": "cat /etc/systemd/system/*.service /etc/systemd/system/*.timer 2>/dev/null",
            "ps": "ps -eo args 2>/dev/null",
            "async jobs": "cat /root/.ansible_async/* 2>/dev/null",
            "state and conf": "cat /var/lib/ttfleet/serve/*.json /etc/ttfleet/serve/*.conf 2>/dev/null",
        }.items():
            texts[f"{host}: {what}"] = host_sh(host, script, check=False).stdout
    # Positive control: the scan finds the token where it legitimately is (the run's private vars file).
    with open(os.path.join(VARS, "gated-token.json"), encoding="utf-8") as handle:
        control = sum(secret in handle.read() for secret in lab.secrets)
    leaks = sorted({where for where, text in texts.items() for secret in secrets_ if secret and secret in text})
    size = sum(len(text) for text in texts.values())
    case.details = {"sources": sorted(texts), "secrets": len(secrets_)}
    case.observed = (
        f"{len(secrets_)} secrets searched in {len(texts)} sources ({size // 1024} KiB); control found the token in "
        f"its vars file: {control == len(lab.secrets)}; leaks: {leaks or 'none'}"
    )
    assert control == len(lab.secrets), "the scan does not find the token even where it is"
    assert len(texts) >= 10
    assert leaks == []
