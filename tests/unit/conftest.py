"""Make `ansible_collections.ttfleet.inference` importable from the checkout.

Unit tests import the collection by its real name, as Ansible does: through the committed link
collections/ansible_collections/ttfleet/inference (this checkout), or the real ansible_collections/ttfleet/inference
path ansible-test copies the tree into.

``patch_module_args`` is ansible-core's (2.19+), or the same contract for the older cores of the support matrix.
"""

import contextlib
import json
import os
import pathlib
import signal
import stat
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")


def _collections_parent():
    parts = ROOT.split(os.sep)
    if parts[-3:-2] == ["ansible_collections"] and parts[-2:] == ["ttfleet", "inference"]:
        return os.sep.join(parts[:-3])
    tree = os.path.join(ROOT, "collections")
    if not os.path.isdir(os.path.join(tree, "ansible_collections", "ttfleet", "inference", "plugins")):
        pytest.exit(f"{tree}/ansible_collections/ttfleet/inference must link to this checkout (it is committed)", 2)
    return tree


_parent = _collections_parent()
if _parent not in sys.path:
    sys.path.insert(0, _parent)


try:
    from ansible.module_utils.testing import patch_module_args  # pylint: disable=unused-import
except ImportError:  # ansible-core < 2.19

    @contextlib.contextmanager
    def patch_module_args(args=None):
        """Give AnsibleModule these arguments, as ansible-core 2.19's patch_module_args does."""
        from ansible.module_utils import basic

        saved = basic._ANSIBLE_ARGS
        basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": args or {}}).encode()
        try:
            yield
        finally:
            basic._ANSIBLE_ARGS = saved


@pytest.fixture(autouse=True)
def _fresh_module_warnings():
    """Each test's module run starts with no warnings: ansible-core keeps them in a process-wide list, which older
    cores never clear between two AnsibleModule runs in one process."""
    from ansible.module_utils.common import warnings

    for name in ("_global_warnings", "_global_deprecations"):
        held = getattr(warnings, name, None)
        if hasattr(held, "clear"):
            held.clear()


# What the root-only victim file holds (an /etc/shadow line): a test asserts that it never leaks.
VICTIM_SECRET = b"root:$6$only-root-reads-this\n"


@pytest.fixture
def no_hang():
    """Fail a test that blocks (a FIFO opened for reading) after 20 s instead of hanging the suite."""

    def expired(*_args):
        raise TimeoutError("blocked for 20 s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def victim(tmp_path):
    """A root-only file (``file``) and directory (``dir``, holding a ``config.json`` too) outside every volume;
    after the test their content, owners, modes and link counts must be what they were."""
    vdir = tmp_path / "root-only"
    vdir.mkdir(mode=0o700)
    os.chmod(vdir, 0o700)
    vfile = vdir / "shadow"
    vfile.write_bytes(VICTIM_SECRET)
    os.chmod(vfile, 0o600)
    inner = vdir / "config.json"
    inner.write_bytes(b"root's config\n")
    os.chmod(inner, 0o600)

    def state():
        found = {}
        for dirpath, dirnames, filenames in os.walk(vdir):
            for name in dirnames + filenames + [""]:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                data = pathlib.Path(path).read_bytes() if stat.S_ISREG(st.st_mode) else None
                found[os.path.relpath(path, vdir)] = (
                    st.st_uid,
                    st.st_gid,
                    stat.S_IMODE(st.st_mode),
                    st.st_nlink,
                    data,
                )
        return found

    before = state()
    yield {"dir": vdir, "file": vfile}
    assert state() == before, "the root-only victim changed"


def pytest_configure(config):
    config.addinivalue_line("markers", "broke30(finding): a finding of issue 30 that the code before the fix got wrong")
