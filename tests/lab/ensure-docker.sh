#!/usr/bin/env bash
# Make a Docker engine answer: install Debian's docker.io when dockerd is missing and start dockerd
# in the background when no daemon answers (CI machines have no systemd to do it).
set -euo pipefail

log() { printf '==> %s\n' "$*" >&2; }

if docker version >/dev/null 2>&1; then
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
  log "installing Debian's docker.io"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq docker.io >/dev/null
fi

if pgrep -x dockerd >/dev/null 2>&1; then
  log "dockerd is running but does not answer yet; waiting"
else
  # A killed dockerd leaves containerd's pid file behind; the next dockerd then waits and fails.
  pidfile=/var/run/docker/containerd/containerd.pid
  if [ -f "$pidfile" ]; then
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      sleep 1
    fi
    rm -f "$pidfile"
  fi
  log "starting dockerd in the background (log: /var/log/ttfleet-dockerd.log)"
  nohup dockerd >/var/log/ttfleet-dockerd.log 2>&1 </dev/null &
fi

for _ in $(seq 1 60); do
  if docker version >/dev/null 2>&1; then
    log "docker engine answers: $(docker version --format '{{.Server.Version}}')"
    exit 0
  fi
  sleep 1
done
log "docker engine did not answer within 60 s; see /var/log/ttfleet-dockerd.log"
tail -n 20 /var/log/ttfleet-dockerd.log >&2 || true
exit 1
