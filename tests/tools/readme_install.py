"""Run the README's install commands verbatim, as an operator would, against this tree instead of GitHub.

    python tests/tools/readme_install.py WORKDIR [README]    (README: another file to take the blocks from)

The README marks what it means to be run:
    <!-- install-check -->                    the next fenced shell block is one way to install
    <!-- install-check: requirements.yml -->  the next fenced block is written to requirements.yml beside it
    <!-- install-check: quick-start -->       the next fenced shell block runs after every install, in a new directory

Each way to install runs in an empty HOME with no ANSIBLE_* variables, twice: from an empty directory (outside a
checkout) and from the root of a fresh clone (inside one; a block that clones goes inside by itself), over an older
version of the collection installed before it (an upgrade must not need --force). The repository URL reaches a bare
repository holding this work tree as branch main, through git's url.<base>.insteadOf in that HOME: nothing is fetched
from GitHub. After each run the collection in ~/.ansible/collections must be a real directory at galaxy.yml's version.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARK = re.compile(r"^<!-- install-check(?:: *([\w.-]+))? -->$")
FENCE = re.compile(r"^```(\w*)$")


def blocks(text):
    """[(kind, lang, body)] of the marked fenced blocks, in README order."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        mark = MARK.match(line.strip())
        if not mark:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        fence = FENCE.match(lines[j].strip()) if j < len(lines) else None
        if not fence:
            sys.exit(f"README.md line {i + 1}: {line.strip()} must be followed by a fenced block")
        end = next((k for k in range(j + 1, len(lines)) if lines[k].strip() == "```"), None)
        if end is None:
            sys.exit(f"README.md line {j + 1}: the fenced block never ends")
        found.append((mark.group(1) or "install", fence.group(1), "\n".join(lines[j + 1 : end]) + "\n"))
    return found


def scenarios(found):
    """Each install block with the requirements.yml written before it, and the quick-start blocks."""
    installs, quick, pending = [], [], None
    for kind, _lang, body in found:
        if kind == "requirements.yml":
            pending = body
        elif kind == "quick-start":
            quick.append(body)
        elif kind == "install":
            installs.append((body, pending))
            pending = None
        else:
            sys.exit(f"README.md: unknown install-check kind {kind!r} (install, requirements.yml, quick-start)")
    if pending is not None:
        sys.exit("README.md: a requirements.yml block has no install block after it")
    return installs, quick


def run(cmd, **kwargs):
    return subprocess.run(cmd, check=True, text=True, **kwargs)


def run_block(label, body, env, cwd):
    """Run a README block with bash; its output is shown only when it fails."""
    got = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", body],
        check=False,
        env=env,
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    if got.returncode != 0:
        sys.exit(f"{got.stdout}\nREADME {label} failed (exit {got.returncode}) in {cwd}:\n{body}")


def git_url(cfg):
    return yaml.safe_load(cfg)["repository"].rstrip("/") + ".git"


def snapshot(work):
    """A bare repository whose branch main is this work tree (tracked and untracked-but-not-ignored files), made
    through a separate index so the checkout's own index and branches are untouched."""
    index = os.path.join(work, "index")
    real = run(["git", "rev-parse", "--git-path", "index"], cwd=ROOT, capture_output=True).stdout.strip()
    shutil.copy(os.path.join(ROOT, real), index)
    env = dict(os.environ, GIT_INDEX_FILE=index)
    run(["git", "add", "-A", "."], cwd=ROOT, env=env)
    tree = run(["git", "write-tree"], cwd=ROOT, env=env, capture_output=True).stdout.strip()
    commit = run(
        ["git", "commit-tree", tree, "-p", "HEAD", "-m", "readme_install snapshot"],
        cwd=ROOT,
        env=dict(
            env,
            GIT_AUTHOR_NAME="check",
            GIT_AUTHOR_EMAIL="check@localhost",
            GIT_COMMITTER_NAME="check",
            GIT_COMMITTER_EMAIL="check@localhost",
        ),
        capture_output=True,
    ).stdout.strip()
    bare = os.path.join(work, "origin.git")
    run(["git", "init", "-q", "--bare", "-b", "main", bare])
    run(["git", "push", "-q", bare, f"{commit}:refs/heads/main"], cwd=ROOT)
    return bare


def older_tarball(work, bare, version):
    """A tarball of this tree labelled with a version below the current one, to install first."""
    src = os.path.join(work, "older-src")
    run(["git", "clone", "-q", bare, src])
    path = os.path.join(src, "galaxy.yml")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(re.sub(r"(?m)^version: .*$", f"version: {version}", text))
    run(["ansible-galaxy", "collection", "build", "--output-path", work, src], capture_output=True)
    return os.path.join(work, f"ttfleet-inference-{version}.tar.gz")


def installed_version(env):
    path = os.path.join(env["HOME"], ".ansible/collections/ansible_collections/ttfleet/inference")
    if os.path.islink(path) or not os.path.isfile(os.path.join(path, "MANIFEST.json")):
        return None
    with open(os.path.join(path, "MANIFEST.json"), encoding="utf-8") as handle:
        return json.load(handle)["collection_info"]["version"]


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    work = os.path.abspath(sys.argv[1])
    os.makedirs(work, exist_ok=True)
    readme = sys.argv[2] if len(sys.argv) == 3 else os.path.join(ROOT, "README.md")
    with open(readme, encoding="utf-8") as handle:
        installs, quick = scenarios(blocks(handle.read()))
    if not installs:
        sys.exit("README.md marks no install block (<!-- install-check --> before a fenced shell block)")
    with open(os.path.join(ROOT, "galaxy.yml"), encoding="utf-8") as handle:
        cfg = handle.read()
    version = yaml.safe_load(cfg)["version"]
    url = git_url(cfg)
    bare = snapshot(work)
    older = older_tarball(work, bare, "0.0.1")
    path = os.pathsep.join([os.path.dirname(sys.executable), "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
    n = 0
    for body, requirements in installs:
        places = ["outside"] if re.search(r"(?m)^\s*git clone ", body) else ["outside", "inside"]
        for place in places:
            n += 1
            case = os.path.join(work, f"{n}-{place}")
            home = os.path.join(case, "home")
            os.makedirs(home)
            env = {"PATH": path, "HOME": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
            run(["git", "config", "--file", os.path.join(home, ".gitconfig"), f"url.file://{bare}.insteadOf", url])
            if place == "inside":
                cwd = os.path.join(case, "ttfleet.inference")
                run(["git", "clone", "-q", url, cwd], env=env)
            else:
                cwd = os.path.join(case, "work")
                os.makedirs(cwd)
            if requirements is not None:
                with open(os.path.join(cwd, "requirements.yml"), "w", encoding="utf-8") as handle:
                    handle.write(requirements)
            run(
                ["ansible-galaxy", "collection", "install", "-p", os.path.join(home, ".ansible/collections"), older],
                env=env,
                cwd=cwd,
                capture_output=True,
            )
            run_block(f"install block ({place})", body, env, cwd)
            got = installed_version(env)
            if got != version:
                sys.exit(
                    f"README install block ({place}) left {got or 'no real directory'} in "
                    f"~/.ansible/collections, expected ttfleet.inference {version} over the older 0.0.1"
                )
            for i, start in enumerate(quick):
                qdir = os.path.join(case, f"quick-{i}")
                os.makedirs(qdir)
                run_block(f"quick start {i + 1} (after the install block, {place})", start, env, qdir)
    print(
        f"README install commands: {n} runs installed ttfleet.inference {version}, quick start ran after each",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
