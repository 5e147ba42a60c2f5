"""Make `ansible_collections.ttfleet.inference` importable from the checkout.

Unit tests import the collection by its real name, as Ansible does. The bootstrap script links the
checkout into .ansible/collections; when it has not run (or ansible-test copied the tree into a real
ansible_collections/ttfleet/inference path) we find the right parent instead.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")


def _collections_parent():
    parts = ROOT.split(os.sep)
    if parts[-3:-2] == ["ansible_collections"] and parts[-2:] == ["ttfleet", "inference"]:
        return os.sep.join(parts[:-3])
    tree = os.path.join(ROOT, ".ansible", "collections")
    link = os.path.join(tree, "ansible_collections", "ttfleet", "inference")
    if not os.path.exists(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(ROOT, os.path.dirname(link)), link)
    return tree


_parent = _collections_parent()
if _parent not in sys.path:
    sys.path.insert(0, _parent)
