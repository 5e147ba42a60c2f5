"""Check version_added of every module, filter and option against the last release.

    python tests/tools/version_added.py

The last release is the newest entry of changelogs/changelog.yaml older than galaxy.yml's version; its tree is the
commit that first wrote that entry. A plugin or option that this tree documents and that release did not must say
version_added: <galaxy.yml's version> (an option may instead leave it out when its plugin is new); a plugin or option
that release had keeps the version_added it had then. Options from the collection's doc fragments count as the
plugin's own.
"""

import ast
import os
import re
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = "ttfleet.inference."


def version_key(text):
    return tuple(int(part) for part in str(text).split("."))


class Tree:
    """Files of the work tree (commit None) or of a commit."""

    def __init__(self, commit=None):
        self.commit = commit

    def read(self, path):
        if self.commit is None:
            full = os.path.join(ROOT, path)
            if not os.path.isfile(full):
                return None
            with open(full, encoding="utf-8") as handle:
                return handle.read()
        got = subprocess.run(
            ["git", "show", f"{self.commit}:{path}"], cwd=ROOT, capture_output=True, text=True, check=False
        )
        return got.stdout if got.returncode == 0 else None

    def listdir(self, path):
        if self.commit is None:
            full = os.path.join(ROOT, path)
            return sorted(os.listdir(full)) if os.path.isdir(full) else []
        got = subprocess.run(
            ["git", "ls-tree", "--name-only", f"{self.commit}:{path}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        return got.stdout.split() if got.returncode == 0 else []


def _assigned(source, name):
    """The string assigned to NAME at module level, or in class ModuleDocFragment.

    A file that does not parse (the 0.2.0 release commit holds two: a half-applied edit, fixed three commits later)
    still documents its plugin: its raw-string assignment is read as text."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        found = re.search(rf'^\s*{name} = r?"""(.*?)"""', source, re.MULTILINE | re.DOTALL)
        return found.group(1) if found else None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return node.value.value
    return None


def fragment(tree, ref):
    name, _sep, var = ref[len(PREFIX) :].partition(".")
    source = tree.read(f"plugins/doc_fragments/{name}.py")
    if source is None:
        sys.exit(f"{ref}: no plugins/doc_fragments/{name}.py")
    return yaml.safe_load(_assigned(source, (var or "documentation").upper())) or {}


def plugins(tree):
    """{'module model_spec': DOCUMENTATION dict with the collection's fragments merged}."""
    docs = {}
    for name in tree.listdir("plugins/modules"):
        if name.endswith(".py") and name != "__init__.py":
            doc = yaml.safe_load(_assigned(tree.read(f"plugins/modules/{name}"), "DOCUMENTATION"))
            docs[f"module {name[:-3]}"] = doc
    for name in tree.listdir("plugins/filter"):
        if name.endswith((".yml", ".yaml")):
            doc = yaml.safe_load(tree.read(f"plugins/filter/{name}"))["DOCUMENTATION"]
            docs[f"filter {doc['name']}"] = doc
    for doc in docs.values():
        options = doc.setdefault("options", {}) or {}
        for ref in doc.get("extends_documentation_fragment") or []:
            if ref.startswith(PREFIX):
                for key, value in (fragment(tree, ref).get("options") or {}).items():
                    options.setdefault(key, value)
        doc["options"] = options
    return docs


def options(opts, prefix=""):
    found = {}
    for key, value in (opts or {}).items():
        value = value or {}
        found[prefix + key] = value.get("version_added")
        found.update(options(value.get("suboptions"), f"{prefix}{key}."))
    return found


def last_release(current):
    with open(os.path.join(ROOT, "changelogs/changelog.yaml"), encoding="utf-8") as handle:
        releases = yaml.safe_load(handle)["releases"]
    older = sorted((v for v in releases if version_key(v) < version_key(current)), key=version_key)
    if not older:
        return None, None
    version = older[-1]
    commits = subprocess.run(
        ["git", "log", "--reverse", "--format=%H", "-G", f"^  {version}:$", "--", "changelogs/changelog.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    commit = commits.stdout.split()[0] if commits.stdout.split() else None
    if commit is None:
        sys.exit(f"changelogs/changelog.yaml has release {version} but no commit wrote it")
    return version, commit


def main():
    with open(os.path.join(ROOT, "galaxy.yml"), encoding="utf-8") as handle:
        current = str(yaml.safe_load(handle)["version"])
    base_version, commit = last_release(current)
    now = plugins(Tree())
    then = plugins(Tree(commit)) if commit else {}
    errors = []
    for plugin, doc in sorted(now.items()):
        added = str(doc.get("version_added"))
        old = then.get(plugin)
        if old is None:
            if added != current:
                errors.append(f"{plugin}: new since {base_version}, so version_added: {current}, not {added}")
        elif added != str(old.get("version_added")):
            errors.append(
                f"{plugin}: {base_version} shipped it with version_added: {old.get('version_added')}, "
                f"keep that, not {added}"
            )
        before = options(old["options"]) if old else {}
        for option, value in sorted(options(doc["options"]).items()):
            if option in before:
                if str(value) != str(before[option]) and value is not None:
                    errors.append(
                        f"{plugin} option {option}: {base_version} shipped it with version_added: "
                        f"{before[option]}, keep that, not {value}"
                    )
            elif old is not None and str(value) != current:
                errors.append(f"{plugin} option {option}: new since {base_version}, so version_added: {current}")
            elif value is not None and version_key(value) > version_key(current):
                errors.append(f"{plugin} option {option}: version_added {value} is after galaxy.yml's {current}")
    for error in errors:
        print(error, file=sys.stderr)
    if errors:
        sys.exit(f"{len(errors)} version_added problems against release {base_version} ({commit[:12]})")
    print(
        f"version_added: {len(now)} plugins and their options agree with release {base_version} "
        f"({commit[:12] if commit else 'none'}) and galaxy.yml {current}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
