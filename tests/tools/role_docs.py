"""Role README variables sections, generated from meta/argument_specs.yml.

    python tests/tools/role_docs.py            rewrite every role README's generated section
    python tests/tools/role_docs.py --check    exit 1 when a README is out of date

The section sits between the markers below; everything else in a README is written by hand.
"""

import argparse
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BEGIN = "<!-- BEGIN generated from meta/argument_specs.yml by tests/tools/role_docs.py -->"
END = "<!-- END generated -->"


def roles():
    base = os.path.join(ROOT, "roles")
    return sorted(d for d in os.listdir(base) if os.path.isfile(os.path.join(base, d, "meta", "argument_specs.yml")))


def load_specs(role):
    with open(os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)["argument_specs"]


def _text(value):
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value or "")


def _default(option):
    if "default" not in option:
        return "required" if option.get("required") else "none"
    text = yaml.safe_dump(option["default"], default_flow_style=True, width=10_000)
    return "`" + text.strip().removesuffix("...").strip() + "`"


def _rows(options, prefix=""):
    rows = []
    for name, option in options.items():
        kind = option.get("type", "str")
        if option.get("elements"):
            kind = f"{kind} of {option['elements']}"
        if option.get("choices"):
            kind += " (" + ", ".join(str(c) for c in option["choices"]) + ")"
        rows.append(f"| `{prefix}{name}` | {kind} | {_default(option)} | {_text(option.get('description'))} |")
        if option.get("options"):
            rows.extend(_rows(option["options"], prefix=f"{prefix}{name}."))
    return rows


def render(role):
    lines = [BEGIN]
    for entry, spec in load_specs(role).items():
        lines += ["", f"### Entry point `{entry}`", "", _text(spec.get("short_description")), ""]
        description = spec.get("description")
        lines += [_text(d) + "\n" for d in description] if isinstance(description, list) else []
        if spec.get("options"):
            lines += ["| variable | type | default | description |", "|---|---|---|---|"]
            lines += _rows(spec["options"])
    lines += ["", END]
    return "\n".join(lines)


def update(role, check):
    path = os.path.join(ROOT, "roles", role, "README.md")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if BEGIN not in text or END not in text:
        print(f"{path}: add the markers {BEGIN!r} and {END!r} where the variables go", file=sys.stderr)
        return False
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    new = head + render(role) + tail
    if new == text:
        return True
    if check:
        print(f"{path} is out of date: run python tests/tools/role_docs.py", file=sys.stderr)
        return False
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(new)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    results = [update(role, args.check) for role in roles()]
    ok = all(results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
