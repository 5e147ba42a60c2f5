#!/usr/bin/env bash
# Build the lab base image: Debian 12 (bookworm) with systemd as PID 1, made by debootstrap from
# Debian's mirror and `docker import`ed. The tag carries a hash of this recipe, so an edited recipe
# builds a new image and an unchanged one is reused.
#   tests/lab/build-image.sh                build when missing, print the tag
#   tests/lab/build-image.sh --force        rebuild
#   tests/lab/build-image.sh --pristine     the pristine machine of `make fresh-check` instead: Debian's minbase with
#                                           systemd and nothing else (no Python, make, rsync, git or tt-smi)
#   tests/lab/build-image.sh --standin      the base of the lab's inference images (tests/lab/upstream_image): Debian's
#                                           minbase with python3 and gosu (the media image's docker-entrypoint.sh drops
#                                           to the user with it) and no documentation (a fraction of the lab image:
#                                           every scenario loads, saves, pushes or pulls it)
#   tests/lab/build-image.sh --suite trixie  a lab host of another Debian release (Debian 13 for the host matrix of
#                                           the fleet scenario); tagged ttfleet-lab/debian-<suite>
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
suite=bookworm
mirror=${TTFLEET_DEBIAN_MIRROR:-http://deb.debian.org/debian}
force=0 flavour=lab
usage="usage: $0 [--force] [--pristine | --standin] [--suite bookworm|trixie]"
while [ $# -gt 0 ]; do
  case "$1" in
    --force) force=1 ;;
    --pristine) flavour=pristine ;;
    --standin) flavour=standin ;;
    --suite)
      case "${2:-}" in
        bookworm|trixie) suite=$2; shift ;;
        *) echo "$usage: --suite takes bookworm or trixie, not '${2:-}'" >&2; exit 2 ;;
      esac ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
  shift
done
if [ "$flavour" = lab ]; then
  # What later roles need on a host (as Ubuntu/Debian servers ship it): python and python3-apt for modules, git/venv for
  # tt-inference-server, rsync/curl for weights, iproute2/procps for diagnostics, and the monitoring a site runs:
  # Debian's node_exporter (its unit reads the textfile directory /var/lib/prometheus/node-exporter; molecule/metrics),
  # and sshd, the way operators reach their hosts (tests/lab/lab.py gives each host an admin user with sudo and a key).
  packages=systemd,systemd-sysv,dbus,python3,python-is-python3,python3-apt,python3-venv,python3-yaml,sudo,iproute2,procps,git,rsync,curl,ca-certificates,util-linux,prometheus-node-exporter,openssh-server
  repo=ttfleet-lab/debian
  [ "$suite" = bookworm ] || repo="ttfleet-lab/debian-$suite"
elif [ "$flavour" = standin ]; then
  packages=python3,gosu
  repo=ttfleet-lab/debian-standin
else
  packages=systemd,systemd-sysv,dbus
  repo=ttfleet-lab/debian-pristine
fi
recipe_hash=$( { cat "$0" "$here/files/tt-smi"; echo "$suite $packages"; } | sha256sum | cut -c1-12)
tag="${repo}:${suite}-${recipe_hash}"

log() { printf '==> %s\n' "$*" >&2; }

# A warm APT archive for the lab hosts, kept beside the image (not in it: the image stays what a fresh host has): the
# .debs of what the roles install in the scenarios that the image lacks (docker.io, docker-registry,
# apache2-utils, zstd, python3-packaging, with dependencies and recommends), downloaded once into
# .cache/lab-debs/<recipe hash>. tests/lab/lab.py provision copies them into each host's /var/cache/apt/archives, as on a
# host that has had them offered before. The roles still run apt-get install against a fresh index; apt takes a .deb
# from the archive only when its size and hash match that index, and downloads it otherwise.
debs_dir="$here/../../.cache/lab-debs/$recipe_hash"
warm_archive() {
  [ "$flavour" = lab ] && [ ! -d "$debs_dir" ] || return 0
  log "downloading the .debs the roles install into .cache/lab-debs/$recipe_hash"
  mkdir -p "$(dirname "$debs_dir")"
  local tmp
  tmp=$(mktemp -d "$debs_dir.XXXXXX")
  chmod 0755 "$tmp"  # apt-get downloads as _apt
  docker run --rm -v "$tmp:/var/cache/apt/archives" "$tag" sh -c \
    'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --download-only \
       docker.io python3-packaging docker-registry apache2-utils zstd >/dev/null' >&2 || { rm -rf "$tmp"; return 1; }
  rm -rf "$tmp/partial" "$tmp/lock"
  # Another run that made it first wins; both are the same files.
  mv -T "$tmp" "$debs_dir" 2>/dev/null || rm -rf "$tmp"
}

if [ "$force" = 0 ] && docker image inspect "$tag" >/dev/null 2>&1; then
  warm_archive
  echo "$tag"
  exit 0
fi

command -v debootstrap >/dev/null 2>&1 || {
  log "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
}

work=$(mktemp -d /var/tmp/ttfleet-rootfs.XXXXXX)
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
log "debootstrap $suite from $mirror (about a minute)"
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2
  exit 1
}

# Container-friendly systemd: no getty, no udev-triggered units that need a real /dev.
for unit in getty.target console-getty.service systemd-udevd.service systemd-udev-trigger.service \
            systemd-modules-load.service sys-kernel-config.mount sys-kernel-debug.mount \
            systemd-remount-fs.service apt-daily.timer apt-daily-upgrade.timer; do
  ln -sf /dev/null "$rootfs/etc/systemd/system/$unit"
done
echo "ttfleet-lab" >"$rootfs/etc/hostname"
: >"$rootfs/etc/machine-id"
# Docker 26 and later (Debian 13's docker.io) write the sysctls of each container's interfaces, which Docker's read-only
# /proc/sys in the lab host refuses ("failed to disable IPv6 on container's interface eth0"). A real host's /proc/sys is
# writable: so is the lab host's, from boot, before the engine starts (the container has CAP_SYS_ADMIN).
if [ "$flavour" = lab ] && [ "$suite" != bookworm ]; then
  cat >"$rootfs/etc/systemd/system/lab-proc-sys-rw.service" <<'UNIT'
[Unit]
Description=LAB STAND-IN: a writable /proc/sys, as on a real host
DefaultDependencies=no
Before=docker.service sysinit.target

[Service]
Type=oneshot
ExecStart=/bin/mount -o remount,rw /proc/sys

[Install]
WantedBy=sysinit.target
UNIT
  mkdir -p "$rootfs/etc/systemd/system/sysinit.target.wants"
  ln -s ../lab-proc-sys-rw.service "$rootfs/etc/systemd/system/sysinit.target.wants/lab-proc-sys-rw.service"
fi
# sshd: openssh-server's postinst made host keys in the rootfs, which every container of the image would share. Each
# lab host makes its own at its first start instead (as a cloned VM's cloud-init does), ed25519 only: the controller
# writes its known_hosts from it (tests/lab/lab.py), and an RSA key costs seconds of CPU per host on a busy machine.
# Key logins only. pam_loginuid fails in a container without CAP_AUDIT_CONTROL, which would refuse every session:
# optional here, as it is on hosts where the audit subsystem is absent.
if [ "$flavour" = lab ]; then
  rm -f "$rootfs"/etc/ssh/ssh_host_*
  cat >"$rootfs/etc/ssh/sshd_config.d/ttfleet-lab.conf" <<'CONF'
HostKey /etc/ssh/ssh_host_ed25519_key
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
CONF
  mkdir -p "$rootfs/etc/systemd/system/ssh.service.d"
  cat >"$rootfs/etc/systemd/system/ssh.service.d/ttfleet-lab-hostkey.conf" <<'UNIT'
[Service]
ExecStartPre=
ExecStartPre=/bin/sh -c 'test -s /etc/ssh/ssh_host_ed25519_key || ssh-keygen -q -t ed25519 -N "" -f /etc/ssh/ssh_host_ed25519_key'
ExecStartPre=/usr/sbin/sshd -t
UNIT
  sed -i 's/^session\s\+required\s\+pam_loginuid.so/session optional pam_loginuid.so/' "$rootfs/etc/pam.d/sshd"
fi
# Hardware stand-in for the lab only: prints the snapshot each lab host was given.
[ "$flavour" = lab ] && install -m 0755 "$here/files/tt-smi" "$rootfs/usr/local/bin/tt-smi"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
[ "$flavour" = standin ] && rm -rf "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/* \
  "$rootfs"/usr/share/info/*
# Like any installed system that has never run `apt-get update`: an index that is old, not fresh.
touch -d @0 "$rootfs"/var/lib/apt/lists

log "docker import -> $tag"
tar -C "$rootfs" -c . | docker import -c 'CMD ["/lib/systemd/systemd"]' - "$tag" >/dev/null
docker tag "$tag" "$repo:latest"
warm_archive
echo "$tag"
