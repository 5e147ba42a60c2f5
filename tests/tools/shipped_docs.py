"""Check the Markdown an installed collection ships, as Galaxy and an operator read it.

    python tests/tools/shipped_docs.py INSTALLED_COLLECTION

- Every relative link, and every backticked path whose first part is a top-level entry of this repository
  (`roles/...`, `tests/...`, `docs/...`), names a file or directory the installed collection holds. Paths of an
  operator's own tree (USER_PATHS) and patterns (`<name>`, `*`) are not repository paths.
- The README's "Included content" lists exactly the roles, playbooks, modules and filters the collection holds.
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Paths in an operator's or an AWX project's own tree, or in a checkout (the committed link that makes a checkout the
# collection), that the docs name on purpose.
USER_PATHS = ("inventories/prod", "collections/requirements.yml", "collections/ansible_collections/ttfleet/inference")
TICKED = re.compile(r"`([A-Za-z0-9_.-]+/[^`\s]*)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def top_level():
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {line.split("/", 1)[0] for line in listed.splitlines()}


def path_problems(installed):
    tops = top_level()
    problems = []
    for base, dirs, files in os.walk(installed):
        dirs[:] = [d for d in dirs if d not in (".git",)]
        for name in files:
            if not name.endswith(".md"):
                continue
            path = os.path.join(base, name)
            rel = os.path.relpath(path, installed)
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            # Fenced blocks hold commands and examples; their paths are an operator's.
            text = re.sub(r"(?ms)^```.*?^```", "", text)
            for target in LINK.findall(text):
                if re.match(r"^[a-z]+:|^#", target):
                    continue
                local = target.split("#", 1)[0]
                if not os.path.exists(os.path.join(os.path.dirname(path), local)):
                    problems.append(f"{rel}: link ({target}) is not in the installed collection")
            for cited in TICKED.findall(text):
                if any(c in cited for c in "<>*{}$") or cited.startswith(USER_PATHS):
                    continue
                if cited.split("/", 1)[0] not in tops:
                    continue
                if not os.path.exists(os.path.join(installed, cited.rstrip("/"))):
                    problems.append(f"{rel}: `{cited}` is not in the installed collection")
    return problems


def content_problems(installed):
    with open(os.path.join(installed, "README.md"), encoding="utf-8") as handle:
        text = handle.read()
    match = re.search(r"(?ms)^## Included content\n(.*?)^## ", text)
    if not match:
        return ["README.md: no '## Included content' section"]
    listed = {}
    for section in re.split(r"(?m)^### ", match.group(1))[1:]:
        title, _sep, body = section.partition("\n")
        listed[title.strip()] = set(re.findall(r"(?m)^- `ttfleet\.inference\.(\w+)`", body))

    def names(sub, suffix):
        full = os.path.join(installed, sub)
        found = os.listdir(full) if os.path.isdir(full) else []
        return {n[: -len(suffix)] if suffix else n for n in found if n.endswith(suffix) and n != "__init__.py"}

    shipped = {
        "Roles": {n for n in names("roles", "") if os.path.isdir(os.path.join(installed, "roles", n))},
        "Playbooks": names("playbooks", ".yml"),
        "Modules": names("plugins/modules", ".py"),
        "Filters": names("plugins/filter", ".yml"),
    }
    problems = []
    for kind, have in shipped.items():
        said = listed.get(kind, set())
        for name in sorted(have - said):
            problems.append(f"README.md: Included content, {kind}: ttfleet.inference.{name} is missing")
        for name in sorted(said - have):
            problems.append(f"README.md: Included content, {kind}: ttfleet.inference.{name} does not exist")
    return problems


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    problems = path_problems(sys.argv[1]) + content_problems(sys.argv[1])
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        sys.exit(
            f"{len(problems)} problems in the shipped Markdown (link the repository on GitHub for files the "
            "tarball does not hold)"
        )
    print(
        "shipped Markdown: every cited repository path is in the tarball; the README lists the content", file=sys.stderr
    )


if __name__ == "__main__":
    main()
