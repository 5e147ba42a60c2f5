#!/usr/bin/env bash
# The test command: ruff, yamllint, ansible-lint, bandit, unit tests, the attacker suite, ansible-test sanity, build + install +
# ansible-doc of the tarball, molecule scenarios, the fast half of the fault suite. Stops at the first failure.
#   tests/run-tests.sh all | lint | unit | attacks | sanity | build | molecule [scenario ...] | faults
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export LANG=C.UTF-8 LC_ALL=C.UTF-8
export ANSIBLE_COLLECTIONS_PATH="$root/.ansible/collections"
export PATH="$root/.venv/bin:$PATH"
export PYTHONDONTWRITEBYTECODE=1
out="$root/tests/output"
mkdir -p "$out"

# Debian packages a stage needs; a pristine Debian 12 has none of these.
need_debs() {
  local missing=() p
  for p in "$@"; do command -v "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

stage() { printf '\n===== %s =====\n' "$*" >&2; }
passed=0
timed() {
  local name=$1 start=$SECONDS; shift
  stage "$name"
  # Not `if ! "$@"`: bash ignores set -e inside a function called as a condition.
  local rc=0
  set +e
  (set -e; "$@")
  rc=$?
  set -e
  if [ "$rc" -ne 0 ]; then
    printf '===== %s: FAILED after %ss =====\n' "$name" "$((SECONDS - start))" >&2
    echo "stages: $passed passed, 1 failed"
    exit 1
  fi
  passed=$((passed + 1))
  printf '===== %s: ok in %ss =====\n' "$name" "$((SECONDS - start))" >&2
}

lint() {
  ruff check .
  yamllint -s .
  ansible-lint --offline --nocolor
  antsibull-changelog lint
  # Security lint of the shipped Python; accepted findings carry `# nosec <id>` with the reason beside them.
  bandit -q -c pyproject.toml -r plugins
}

unit() {
  # Kernel-cache archives are .tar.zst: without zstd their tests would only be skipped.
  need_debs zstd
  pytest tests/unit -q -p no:cacheprovider
}

# The attacker suite (tests/attacks): a hostile uid 1000 (setpriv, a real unprivileged process) against the root-run
# modules on real directories; no Docker. TTFLEET_ATTACK_CHECKOUT=<other checkout> aims it at other code.
attacks() {
  need_debs zstd
  pytest tests/attacks -q -p no:cacheprovider
}

# ansible-test needs a real ansible_collections/ttfleet/inference path (it refuses symlinks), the
# third-party collections beside it, and a get-pip.py it would otherwise download: the stand-in
# below bootstraps pip with ensurepip and then upgrades it from PyPI.
sanity() {
  # ansible-test skips its shellcheck test when the program is missing.
  need_debs shellcheck rsync
  local base="$out/sanity-tree" dest
  dest="$base/ansible_collections/ttfleet/inference"
  mkdir -p "$dest"
  rsync -a --delete --exclude-from=<(printf '%s\n' .venv .ansible .cache .git tests/output '*.tar.gz' __pycache__ .pytest_cache .ruff_cache .hypothesis) ./ "$dest/"
  for c in community/docker community/library_inventory_filtering_v1 ansible/posix; do
    mkdir -p "$base/ansible_collections/$(dirname $c)"
    rsync -a --delete ".ansible/collections/ansible_collections/$c/" "$base/ansible_collections/$c/"
  done
  local pipver
  pipver=$(python - <<'PY'
import pathlib, re, ansible_test
src = (pathlib.Path(ansible_test.__file__).parent / "_internal/python_requirements.py").read_text()
print(re.search(r"pip='([0-9.]+)'", src).group(1))
PY
)
  mkdir -p "$HOME/.ansible/test/cache"
  cat >"$HOME/.ansible/test/cache/get_pip_${pipver//./_}.py" <<PY
# Offline stand-in for get-pip.py written by tests/run-tests.sh: ensurepip, then pip $pipver from PyPI.
import subprocess, sys
subprocess.run([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"], check=True)
subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "pip==$pipver"] + [a for a in sys.argv[1:] if not a.startswith("-")], check=True)
PY
  (cd "$dest" && git init -q . 2>/dev/null; ANSIBLE_COLLECTIONS_PATH="$base" ansible-test sanity --python 3.11 --requirements --color=no -v)
}

build() {
  local tmp
  tmp=$(mktemp -d "$out/build.XXXXXX")
  ansible-galaxy collection build --force --output-path "$tmp" .
  local tarball
  tarball=$(ls "$tmp"/ttfleet-inference-*.tar.gz)
  # Only the installed tarball is visible from here on, not the checkout.
  export ANSIBLE_COLLECTIONS_PATH="$tmp/collections"
  ansible-galaxy collection install --force -p "$tmp/collections" "$tarball" >/dev/null
  local inst="$tmp/collections/ansible_collections/ttfleet/inference"
  test -f "$inst/MANIFEST.json"
  # Nothing from the lab, venvs or build products may end up in the artifact.
  if tar -tzf "$tarball" | grep -E '^(\.venv|\.ansible|\.cache|tests/output|inventories/lab/hosts\.yml)(/|$)'; then
    echo "build_ignore leaks the files above into $tarball" >&2; return 1
  fi
  local listed
  listed=$(ansible-doc -l ttfleet.inference)
  echo "$listed"
  local names=()
  for f in "$inst"/plugins/modules/*.py; do
    [ -e "$f" ] || continue
    names+=("ttfleet.inference.$(basename "$f" .py)")
  done
  for n in "${names[@]}"; do
    grep -q "^$n " <<<"$listed" || { echo "ansible-doc -l does not list $n" >&2; return 1; }
    ansible-doc "$n" >/dev/null
  done
  for f in "$inst"/plugins/filter/*.py; do
    [ -e "$f" ] || continue
    ansible-doc -t filter -l ttfleet.inference >/dev/null
  done
  for r in "$inst"/roles/*/; do
    [ -d "$r" ] || continue
    ansible-doc -t role "ttfleet.inference.$(basename "$r")" >/dev/null
  done
  echo "built $(basename "$tarball") ($(du -h "$tarball" | cut -f1)), ansible-doc ok for ${#names[@]} modules" >&2
  rm -rf "$tmp"
}

molecule_stage() {
  tests/lab/ensure-docker.sh
  tests/lab/build-image.sh >/dev/null
  local scenarios=("$@")
  if [ ${#scenarios[@]} -eq 0 ]; then
    mapfile -t scenarios < <(find molecule -mindepth 2 -maxdepth 2 -name molecule.yml -printf '%h\n' | xargs -n1 basename | sort)
  fi
  for s in "${scenarios[@]}"; do
    timed "molecule $s" molecule test -s "$s"
  done
}

# The fault-injection suite (tests/faults): its fast half here; TTFLEET_FAULTS=all (make faults) runs every case
# and rewrites docs/faults.md.
faults() {
  tests/lab/ensure-docker.sh
  tests/lab/build-image.sh >/dev/null
  pytest tests/faults -q -p no:cacheprovider -m "faults and not slow"
}

what=${1:-all}
shift || true
case "$what" in
  all)
    timed lint lint
    timed unit unit
    timed attacks attacks
    timed sanity sanity
    timed build build
    molecule_stage
    timed faults faults
    ;;
  lint | unit | attacks | sanity | build | faults) timed "$what" "$what" ;;
  molecule) molecule_stage "$@" ;;
  *) echo "usage: $0 all|lint|unit|attacks|sanity|build|molecule [scenario...]|faults" >&2; exit 2 ;;
esac
stage "all requested checks passed"
echo "stages: $passed passed, 0 failed"
