# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Property test: alias operations never lose data and always leave what they promised."""

from __future__ import annotations

import itertools
import os
import tempfile
from collections import Counter

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import TEMP_PREFIX
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.alias import (
    apply_plan,
    plan_absent,
    plan_alias,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.checks import VolumeError

# Alias slots: two beside the volumes, one inside a volume.
SLOTS = ("x", "y", "vol_b/z")
# Sources: volumes, a subdirectory, the slots themselves (links or real entries), a file,
# something missing, the root (an ancestor of every slot).
SOURCES = ("vol_a", "vol_b", "vol_a/inner", "x", "y", "vol_b/z", "afile", "missing", ".")
INITIAL = ("absent", "dir", "empty_dir", "file", "link", "dangling")

_counter = itertools.count()


def _write(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(f"content-{next(_counter)}".encode())


def build_tree(root, initial):
    _write(os.path.join(root, "vol_a", "weights", "config.json"))
    _write(os.path.join(root, "vol_a", "inner", "kernel.bin"))
    _write(os.path.join(root, "vol_b", "weights", "tokenizer.json"))
    _write(os.path.join(root, "afile"))
    for slot, state in zip(SLOTS, initial, strict=True):
        path = os.path.join(root, slot)
        if state == "dir":
            _write(os.path.join(path, "precious.bin"))
        elif state == "empty_dir":
            os.mkdir(path)
        elif state == "file":
            _write(path)
        elif state == "link":
            os.symlink("vol_a" if "/" not in slot else "../vol_a", path)
        elif state == "dangling":
            os.symlink("nowhere", path)


def inventory(root):
    """Contents of every regular file and the number of directories, links not followed."""
    contents = Counter()
    directories = 0
    for current, dirs, files in os.walk(root):
        directories += len([d for d in dirs if not os.path.islink(os.path.join(current, d))])
        for name in files:
            full = os.path.join(current, name)
            if os.path.islink(full):
                continue
            with open(full, "rb") as handle:
                contents[handle.read()] += 1
    return contents, directories


def entry_state(path):
    if os.path.islink(path):
        return ("link", os.readlink(path))
    if os.path.isdir(path):
        return ("dir",)
    if os.path.lexists(path):
        return ("file",)
    return ("absent",)


def refusal(message):
    for reason in ("loop", "outside allowed_roots", "does not exist", "is not a directory", "dangling", "real"):
        if reason in message:
            return reason
    return message


operation = st.one_of(
    st.tuples(
        st.just("alias"),
        st.sampled_from(SLOTS),
        st.sampled_from(SOURCES),
        st.booleans(),
        st.booleans(),
        st.sampled_from([None, ("vol_a",), ("vol_a", "vol_b")]),
    ),
    st.tuples(st.just("absent"), st.sampled_from(SLOTS)),
)


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    initial=st.tuples(*[st.sampled_from(INITIAL) for _slot in SLOTS]),
    operations=st.lists(operation, max_size=12),
)
def test_alias_operations_preserve_data(initial, operations):
    with tempfile.TemporaryDirectory() as top:
        root = os.path.join(top, "cache")
        os.mkdir(root)
        build_tree(root, initial)
        expected_files, expected_dirs = inventory(root)
        promised = {slot: entry_state(os.path.join(root, slot)) for slot in SLOTS}

        for op in operations:
            slot_path = os.path.join(root, op[1])
            before = {slot: entry_state(os.path.join(root, slot)) for slot in SLOTS}
            try:
                if op[0] == "alias":
                    _kind, slot, source, force, relative, allowed = op
                    plan = plan_alias(
                        slot_path,
                        os.path.normpath(os.path.join(root, source)),
                        force=force,
                        relative=relative,
                        allowed_roots=[os.path.join(root, r) for r in allowed] if allowed else None,
                    )
                else:
                    plan = plan_absent(slot_path)
                # Planning is check mode: it must not change anything.
                assert {slot: entry_state(os.path.join(root, slot)) for slot in SLOTS} == before
                apply_plan(plan)
            except VolumeError as exc:
                event(f"refused: {refusal(str(exc))}")
                assert {slot: entry_state(os.path.join(root, slot)) for slot in SLOTS} == before
                continue

            event(f"applied: {plan['action']}")
            if op[0] == "alias":
                promised[op[1]] = ("link", plan["target"])
                # The link resolves to the directory the caller named.
                assert os.path.realpath(slot_path) == os.path.realpath(os.path.join(root, op[2]))
            else:
                promised[op[1]] = ("absent",)

            for slot in SLOTS:
                slot_dir = os.path.dirname(os.path.join(root, slot))
                if os.path.isdir(slot_dir):
                    assert entry_state(os.path.join(root, slot)) == promised[slot], (slot, op)

            files, dirs = inventory(root)
            assert files == expected_files
            assert dirs == expected_dirs
            assert not [n for n in os.listdir(root) if n.startswith(TEMP_PREFIX)]
