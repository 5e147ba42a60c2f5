#!/usr/bin/env bash
# Prepare this checkout on a fresh Debian 12 machine (as root, PyPI and Debian's mirror only):
#   tools   .venv with the pinned tools of requirements.txt, and the collection tree under
#           .ansible/collections (this checkout as ttfleet.inference + third-party collections
#           taken from the `ansible` wheel on PyPI; nothing from Galaxy)
#   docker  a Docker engine that answers, and the lab base image
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
  want=$(sha256sum requirements.txt | cut -d' ' -f1)
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
  .venv/bin/pip install -q "$(grep -m1 '^pip==' requirements.txt)" 2>&1 | grep -v 'is ignored' || true
  .venv/bin/pip install -q -r requirements.txt 2>&1 | grep -v 'is ignored' || true
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

ensure_docker() {
  tests/lab/ensure-docker.sh
  tests/lab/build-image.sh >/dev/null
}

steps=${*:-tools docker}
for step in $steps; do
  case "$step" in
    tools) ensure_venv; ensure_collections ;;
    docker) ensure_docker ;;
    *) log "unknown step $step (tools, docker)"; exit 2 ;;
  esac
done
