#!/bin/sh
# Install one tt-inference-server release as ROOT/releases/TAG, all or nothing: the checkout is built
# in ROOT/releases/.stage-TAG, its commit checked, and only then renamed into place. Run by the
# inference_server role (ansible.builtin.script with creates=ROOT/releases/TAG).
#
#   install-release.sh ROOT TAG SOURCE LOCATION DEPTH COMMIT [ENV_FILE]
#
# ENV_FILE:       a file only root can read, of NAME='value' lines (sh-quoted): the proxy variables,
#                 TTFLEET_TTIS_GIT_URL and TTFLEET_FETCH_TIMEOUT. They are sourced and exported here, because
#                 what Ansible's `environment:` sets is written onto the remote command line, which every local
#                 user can read in /proc/*/cmdline. Without it, the same names are read from the environment.
# SOURCE git:     the URL is read from $TTFLEET_TTIS_GIT_URL, never from the command line (it may hold
#                 a token); it is not stored in the checkout either (no remote, no FETCH_HEAD). The
#                 user:password of an http(s) URL reaches git through a credential-store file only root can
#                 read, never in the URL: git hands the URL it fetches on to its remote helper's command line.
# SOURCE bundle:  LOCATION is a git bundle on the host; it is removed after a successful install.
# SOURCE archive: LOCATION is a tar archive of a checkout (GitHub's layout: one top directory); it is
#                 removed after a successful install. Its commit is the one `git archive` wrote into
#                 the header, or that of a .git inside it.
# SOURCE path:    LOCATION is a directory on the host: a git repository (the tag is fetched from it)
#                 or a plain copy of a checkout.
# Only the tag ref refs/tags/TAG is used: release branches carry the same names as the tags.
# COMMIT (empty, or 7 to 40 hex digits) must match the start of the checked-out commit.
# Every fetch is bounded: $TTFLEET_FETCH_TIMEOUT seconds in all (default 1800, coreutils timeout), and over HTTP(S)
# less than 1 KiB/s for 60 s is a stall (http.lowSpeedLimit/lowSpeedTime), so a silent or dripping origin ends it.
set -eu
umask 022

root=$1 tag=$2 source=$3 location=$4 depth=$5 commit=$6
if [ $# -ge 7 ]; then
  case $7 in
    /*) ;;
    *) echo "install-release: the environment file $7 is not an absolute path" >&2; exit 1 ;;
  esac
  set -a
  # shellcheck source=/dev/null
  . "$7"
  set +a
fi
releases=$root/releases
final=$releases/$tag
stage=$releases/.stage-$tag
marker=.ttfleet-release.json
fetch_timeout=${TTFLEET_FETCH_TIMEOUT:-1800}
case $fetch_timeout in '' | *[!0-9]*) echo "install-release: TTFLEET_FETCH_TIMEOUT must be a number of seconds" >&2; exit 1 ;; esac

fail() {
  echo "install-release: $*" >&2
  rm -rf "$stage" "$stage.unpack"
  exit 1
}

# The credential-store directory of a git URL with credentials, removed however the script ends.
secrets=
trap '[ -z "$secrets" ] || rm -rf "$secrets"' EXIT
trap 'exit 1' HUP INT TERM

[ ! -e "$final" ] || fail "$final exists already; it is never overwritten"
mkdir -p "$releases"
rm -rf "$stage" "$stage.unpack"

fetch_tag() { # fetch_tag FROM [git fetch options]: check out refs/tags/TAG from FROM into the stage
  from=$1
  shift
  git init -q "$stage"
  rc=0
  GIT_TERMINAL_PROMPT=0 timeout -k 10 "$fetch_timeout" git -C "$stage" -c http.lowSpeedLimit=1024 -c http.lowSpeedTime=60 \
    fetch -q --no-tags --no-write-fetch-head "$@" "$from" "+refs/tags/$tag:refs/tags/$tag" || rc=$?
  case $rc in
    0) ;;
    124 | 137) fail "fetching refs/tags/$tag from the $source source took longer than $fetch_timeout s (inference_server_fetch_timeout)" ;;
    *) fail "cannot fetch refs/tags/$tag from the $source source (a stall is less than 1 KiB/s for 60 s); git's own message is hidden while inference_server_no_log is true" ;;
  esac
  git -C "$stage" -c advice.detachedHead=false checkout -q --detach "refs/tags/$tag^{commit}" \
    || fail "cannot check out refs/tags/$tag"
}

case $source in
  git)
    url=${TTFLEET_TTIS_GIT_URL:-}
    [ -n "$url" ] || fail "TTFLEET_TTIS_GIT_URL is empty"
    GIT_CONFIG_COUNT=1
    case $url in
      http://* | https://*)
        scheme=${url%%://*}
        rest=${url#*://}
        authority=${rest%%/*}
        case $authority in
          *@*)
            # user:TOKEN@ goes to a root-only credential-store file (git percent-decodes it as it would the URL's);
            # the helpers root may have configured are reset, so none of them is asked to store the token.
            secrets=$(mktemp -d)
            (umask 077 && printf '%s://%s\n' "$scheme" "$authority" >"$secrets/credentials") \
              || fail "cannot write the git credentials to $secrets"
            url=$scheme://${authority##*@}${rest#"$authority"}
            GIT_CONFIG_COUNT=4 GIT_CONFIG_KEY_1=credential.helper GIT_CONFIG_VALUE_1=
            GIT_CONFIG_KEY_2=credential.helper GIT_CONFIG_VALUE_2="store --file=$secrets/credentials"
            GIT_CONFIG_KEY_3=credential.useHttpPath GIT_CONFIG_VALUE_3=false
            export GIT_CONFIG_KEY_1 GIT_CONFIG_VALUE_1 GIT_CONFIG_KEY_2 GIT_CONFIG_VALUE_2 GIT_CONFIG_KEY_3 GIT_CONFIG_VALUE_3
            ;;
        esac
        ;;
    esac
    # The remote exists only in this process's environment (git >= 2.31), not in .git/config.
    GIT_CONFIG_KEY_0=remote.origin.url GIT_CONFIG_VALUE_0=$url
    export GIT_CONFIG_COUNT GIT_CONFIG_KEY_0 GIT_CONFIG_VALUE_0
    if [ "$depth" -gt 0 ]; then
      fetch_tag origin --depth "$depth"
    else
      fetch_tag origin
    fi
    ;;
  bundle)
    [ -f "$location" ] || fail "bundle $location is missing"
    fetch_tag "$location"
    ;;
  path)
    [ -d "$location" ] || fail "inference_server_path $location is not a directory on the host"
    if git -C "$location" rev-parse --git-dir >/dev/null 2>&1; then
      fetch_tag "$location"
    else
      mkdir "$stage"
      cp -R "$location/." "$stage/" || fail "cannot copy $location"
    fi
    ;;
  archive)
    [ -f "$location" ] || fail "archive $location is missing"
    mkdir "$stage.unpack"
    tar --no-same-owner -xf "$location" -C "$stage.unpack" || fail "cannot unpack $location"
    set -- "$stage.unpack"/* "$stage.unpack"/.[!.]*
    top=
    for entry in "$@"; do
      [ -e "$entry" ] || continue
      if [ -z "$top" ] && [ -d "$entry" ]; then top=$entry; else top=multiple; fi
    done
    if [ -n "$top" ] && [ "$top" != multiple ]; then
      mv "$top" "$stage"
      rmdir "$stage.unpack"
    else
      mv "$stage.unpack" "$stage"
    fi
    ;;
  *) fail "unknown source $source" ;;
esac

if [ -e "$stage/.git" ]; then
  actual=$(git -C "$stage" rev-parse HEAD)
  echo "/$marker" >>"$stage/.git/info/exclude"
elif [ "$source" = archive ]; then
  case $location in
    *.gz | *.tgz) actual=$(gzip -dc "$location" | git get-tar-commit-id || true) ;;
    *) actual=$(git get-tar-commit-id <"$location" || true) ;;
  esac
else
  actual=
fi

if [ -n "$commit" ]; then
  [ -n "$actual" ] || fail "inference_server_commit is $commit but the $source source of $tag carries no git metadata to verify it against; use a git, bundle or path (git repository) source, or a git-archive tarball"
  expected=$(printf '%s' "$commit" | tr 'A-F' 'a-f')
  case $actual in
    "$expected"*) ;;
    *) fail "$tag is commit $actual, not inference_server_commit $commit; the tag moved or the pin is wrong. Nothing was switched" ;;
  esac
fi

installed_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)
printf '{"tag": "%s", "commit": %s, "source": "%s", "installed_at": "%s"}\n' \
  "$tag" "$([ -n "$actual" ] && printf '"%s"' "$actual" || printf null)" "$source" "$installed_at" >"$stage/$marker"
chown -R 0:0 "$stage"
chmod -R u+rwX,go+rX,go-w "$stage"
mv -T "$stage" "$final"
case $source in
  bundle | archive) rm -f "$location" ;;
esac
cat "$final/$marker"
