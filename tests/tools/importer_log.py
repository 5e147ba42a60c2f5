"""Fail on any galaxy-importer error, and on any warning that docs/development.md ("galaxy-importer's warnings")
does not explain.

    python tests/tools/importer_log.py LOG INSTALLED_COLLECTION

Explained, and only in these forms:
- flake8 E999 on a filter's YAML documentation (plugins/filter/*.yml): the importer hands every plugin file to
  flake8, which parses YAML as Python;
- flake8 E203, W503, W504 on Python files: pycodestyle checks that flake8 itself leaves off by default and that
  contradict PEP 8 (and each other: W503 and W504) as ruff format writes it; the importer's --select turns them on;
- "Ignore files skip ansible-test sanity tests": only for ignore files whose every entry is
  validate-modules:missing-gplv3-license of a module or callback plugin (the collection is Apache-2.0, not GPLv3).
"""

import os
import re
import sys

FLAKE8 = re.compile(r"^WARNING: (?P<path>\S+?):\d+:\d+: (?P<code>[A-Z]\d+) ")
IGNORES = re.compile(r"^WARNING: Ignore files skip ansible-test sanity tests, found (?P<file>ignore-[0-9.]+\.txt) ")
GPL = re.compile(r"^plugins/(modules|callback)/\w+\.py validate-modules:missing-gplv3-license( #.*)?$")


def explained(line, installed):
    match = FLAKE8.match(line)
    if match:
        path, code = match["path"], match["code"]
        if code == "E999":
            return path.startswith("plugins/filter/") and path.endswith(".yml")
        return code in ("E203", "W503", "W504") and path.endswith(".py")
    match = IGNORES.match(line)
    if match:
        with open(os.path.join(installed, "tests/sanity", match["file"]), encoding="utf-8") as handle:
            entries = [entry.strip() for entry in handle if entry.strip()]
        return all(GPL.match(entry) for entry in entries)
    return False


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    if not any("Importer processing completed successfully" in line for line in lines):
        print("\n".join(lines[-20:]), file=sys.stderr)
        sys.exit("galaxy-importer did not complete")
    errors = [line for line in lines if re.match(r"^(ERROR|CRITICAL)\b", line) or ": ERROR" in line]
    unexplained = [line for line in lines if line.startswith("WARNING") and not explained(line, sys.argv[2])]
    for line in errors + unexplained:
        print(line, file=sys.stderr)
    if errors or unexplained:
        sys.exit(
            f"galaxy-importer: {len(errors)} errors, {len(unexplained)} warnings that docs/development.md does not "
            "explain: fix them (or, if they cannot be, explain them there and in tests/tools/importer_log.py)"
        )
    warned = sum(line.startswith("WARNING") for line in lines)
    print(
        f"galaxy-importer (flake8 on): 0 errors, {warned} warnings, each of a kind docs/development.md explains",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
