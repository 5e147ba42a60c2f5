#!/usr/bin/env bash
# make fresh-check: the README's two set-up commands on a pristine Debian 12 machine, whatever state this one is in.
#
# It clones the committed HEAD (never the work tree) into a new systemd container of a pristine debootstrap image
# (build-image.sh --pristine: Debian 12's minbase with systemd and nothing else: no Python, make, git, rsync or Docker),
# gives it nothing of this machine
# but its CA certificates and /etc/pip.conf (the way this machine reaches PyPI and Debian's mirror), and runs there, as
# root, `make demo` then `make test`. That container starts its own Docker engine (ensure-docker.sh installs docker.io), builds its
# own lab image, and its lab hosts run their own engines for the serve scenarios: three levels of engines, each with
# /var/lib/docker on a bind mount of this machine's filesystem (overlay2 on overlay would not work).
#
#   tests/lab/fresh-check.sh [COMMAND ...]     default: "make demo" "make test"; e.g. "tests/run-tests.sh lint"
#   TTFLEET_FRESH_KEEP=1                       keep the container and its work directory for a look inside
#
# Prints each command's time and each test stage's time (from run-tests.sh), and a summary line; logs go to
# tests/output/fresh-check/. Exits non-zero when a command fails.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
log() { printf '==> %s\n' "$*" >&2; }

commands=("$@")
[ ${#commands[@]} -gt 0 ] || commands=("make demo" "make test")

tests/lab/ensure-docker.sh
image=$(tests/lab/build-image.sh --pristine)

out="$root/tests/output/fresh-check"
# The bind mounts live on this machine's filesystem (ext4, overlay2-capable), under .cache, never in the clone.
work="$root/.cache/fresh-check"
name="ttfleet-fresh-check"
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  if [ "${TTFLEET_FRESH_KEEP:-}" = 1 ]; then
    log "kept: docker exec -it $name bash (work directory $work)"
    return
  fi
  # Stop the inner engines (and so their containers) before the container goes, so no mount stays busy.
  docker exec "$name" bash -c 'cd /root/src && make lab-down >/dev/null 2>&1; pkill dockerd; sleep 2' >/dev/null 2>&1 || true
  docker rm -f "$name" >/dev/null 2>&1 || true
  rm -rf "$work"
}
docker rm -f "$name" >/dev/null 2>&1 || true
rm -rf "$work" "$out"
mkdir -p "$work/docker" "$out"
git clone -q "$root" "$work/src"
commit=$(git -C "$work/src" log -1 --format='%h (%cs)')
log "pristine Debian 12 container $name with the committed HEAD: $commit"
trap cleanup EXIT

docker run -d --name "$name" --hostname fresh-check \
  --cap-add SYS_ADMIN --cap-add NET_ADMIN --security-opt seccomp=unconfined --cgroupns=host \
  -v /sys/fs/cgroup:/sys/fs/cgroup:rw --tmpfs /run --tmpfs /run/lock --tmpfs /tmp:exec \
  -v "$work/docker:/var/lib/docker" -v "$work/src:/root/src" \
  --stop-signal SIGRTMIN+3 "$image" /lib/systemd/systemd >/dev/null

# This machine's way out to PyPI and Debian's mirror, nothing else.
docker exec "$name" mkdir -p /usr/local/share/ca-certificates /etc/ssl/certs
for c in /usr/local/share/ca-certificates/*.crt; do
  [ -e "$c" ] && docker cp "$c" "$name:/usr/local/share/ca-certificates/"
done
[ -f /etc/ssl/certs/ca-certificates.crt ] && docker cp /etc/ssl/certs/ca-certificates.crt "$name:/etc/ssl/certs/ca-certificates.crt"
[ -f /etc/pip.conf ] && docker cp /etc/pip.conf "$name:/etc/pip.conf"

# What a pristine machine lacks is the point: show it.
docker exec "$name" bash -c 'for p in make python3 git docker rsync debootstrap shellcheck zstd; do
  command -v "$p" >/dev/null 2>&1 && echo "present: $p" || echo "absent: $p"; done' | paste -sd' ' - >&2

summary=()
status=0
total_start=$SECONDS
for cmd in "${commands[@]}"; do
  logfile="$out/$(tr -c 'a-zA-Z0-9\n' '-' <<<"$cmd").log"
  log "$cmd (log: $logfile)"
  start=$SECONDS
  rc=0
  # The README's commands as a new user types them: as root in the clone, after the README's
  # `apt-get install -y git make` when either is missing, with no environment of ours.
  docker exec -e LANG=C.UTF-8 -e LC_ALL=C.UTF-8 "$name" bash -c \
    "cd /root/src && { command -v make >/dev/null && command -v git >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq git make >/dev/null; }; } && $cmd" \
    >"$logfile" 2>&1 </dev/null || rc=$?
  took=$((SECONDS - start))
  grep -E '^===== .*: (ok|FAILED) (in|after) [0-9]+s =====$' "$logfile" | sed 's/^=====/   /; s/ =====$//' >&2 || true
  if [ "$rc" -eq 0 ]; then
    summary+=("$cmd: ok in ${took}s")
  else
    summary+=("$cmd: FAILED (exit $rc) after ${took}s")
    tail -n 40 "$logfile" >&2
    status=1
    break
  fi
done
log "fresh-check of $commit on a pristine Debian 12 container, $((SECONDS - total_start))s in all:"
printf '   %s\n' "${summary[@]}" >&2
passed=0
for s in "${summary[@]}"; do case "$s" in *": ok in "*) passed=$((passed + 1)) ;; esac; done
echo "fresh-check: $passed passed, $status failed"
exit "$status"
