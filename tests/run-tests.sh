#!/usr/bin/env bash
# The test command: ruff, yamllint, ansible-lint, bandit, unit tests, the attacker suite, ansible-test sanity, the support
# matrix (sanity and unit tests on the lowest ansible-core claimed), build + install + ansible-doc of the tarball, the
# packaging checks (galaxy-importer, antsibull-docs lint, ansible-builder), the entry points (a checkout without
# `make tools`, an installed tarball), molecule scenarios, the fast half of the fault suite. Stops at the first failure.
#   tests/run-tests.sh all                     every stage: the quick ones in turn, then the rest two at a time (see all())
#   tests/run-tests.sh STAGE [STAGE ...]       lint unit attacks hostile sanity matrix build package entrypoints faults
#   tests/run-tests.sh molecule [SCENARIO ...]
#   tests/run-tests.sh parallel JOB ...        jobs side by side, e.g. parallel "molecule serve" "molecule fleet" "faults"
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export LANG=C.UTF-8 LC_ALL=C.UTF-8
export ANSIBLE_COLLECTIONS_PATH="$root/.ansible/collections"
export PATH="$root/.venv/bin:$PATH"
export PYTHONDONTWRITEBYTECODE=1
out="$root/tests/output"
mkdir -p "$out"

# Debian packages a stage needs; a pristine Debian 12 has none of these. COMMAND or COMMAND:PACKAGE.
need_debs() {
  local missing=() p
  for p in "$@"; do command -v "${p%%:*}" >/dev/null 2>&1 || missing+=("${p#*:}"); done
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
  # Type checks of every plugin (settings in pyproject.toml), through the committed collections/ link.
  mypy -p ansible_collections.ttfleet.inference.plugins
  # The example alert rules, with Debian's promtool taken out of its package (tests/lab/prometheus.py bin): they parse,
  # and each alert fires and stays quiet where docs/examples/prometheus/ttfleet-alerts.test.yml says.
  local promtool
  promtool="$(python tests/lab/prometheus.py bin)/promtool"
  "$promtool" check rules docs/examples/prometheus/ttfleet-alerts.yml
  (cd docs/examples/prometheus && "$promtool" test rules ttfleet-alerts.test.yml)
}

unit() {
  # Kernel-cache archives are .tar.zst: without zstd their tests would only be skipped.
  need_debs zstd
  pytest tests/unit -q -p no:cacheprovider -n 2
}

# The attacker suite (tests/attacks): a hostile uid 1000 (setpriv, a real unprivileged process) against the root-run
# modules on real directories; no Docker. TTFLEET_ATTACK_CHECKOUT=<other checkout> aims it at other code.
attacks() {
  need_debs zstd
  # Two workers: each case has its own arena and attacker; the three release-install cases (ansible-playbook runs,
  # about 10 s each) would otherwise run one after another.
  pytest tests/attacks -q -p no:cacheprovider -n 2
}

# The hostile-server harness (tests/hostile): local servers on 127.0.0.1 play a broken or malicious hub, S3 endpoint, peer,
# kernel store and instance port against the real clients, servers and health checks; each test asserts its bound (time,
# bytes on disk, peak memory, credentials that reached a catcher port, restarts counted). No Docker.
hostile() {
  # tinyproxy: the real proxy of tests/hostile/test_proxy.py.
  need_debs zstd tinyproxy
  # Most of its time is spent waiting for deadlines to pass, so four workers on two cores; every bound it asserts
  # leaves room for that load.
  pytest tests/hostile -q -p no:cacheprovider -n 4
}

# ansible-test sanity as Automation Hub runs it: on the installed tarball, with the tests/config.yml and
# tests/sanity/ignore-*.txt it ships. The development tooling (tests/ but those two, bench, molecule, the lab inventory)
# is copied in beside it, so one run also covers the code that never ships; SANITY_SHIPPED=1 leaves it out (the matrix:
# the collection users run on an older core, whose older pylint need not parse the tooling). ansible-test needs a real
# ansible_collections/ttfleet/inference path (it refuses symlinks), the third-party collections beside it, and a
# get-pip.py it would otherwise download: the stand-in below bootstraps pip with ensurepip and upgrades it from PyPI.
sanity() {
  # ansible-test skips its shellcheck test when the program is missing.
  need_debs shellcheck rsync git
  local base="$out/sanity-tree" dest tarball
  dest="$base/ansible_collections/ttfleet/inference"
  rm -rf "$dest" "$base/build"
  mkdir -p "$base/build"
  tarball=$(build_tarball "$base/build")
  ANSIBLE_COLLECTIONS_PATH="$base" ansible-galaxy collection install -p "$base" "$tarball" >/dev/null
  test -f "$dest/MANIFEST.json"
  if [ "${SANITY_SHIPPED:-}" != 1 ]; then
    git ls-files -z --cached --others --exclude-standard -- tests bench molecule inventories/lab .config \
      | grep -zvE '^tests/(sanity/|config\.yml$|output/)' \
      | rsync -a --from0 --files-from=- ./ "$dest/"
  fi
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

# The support matrix: the lowest ansible-core that meta/runtime.yml claims (the '#matrix' pins of requirements-dev.txt,
# in .venv-<x.y>, made by bootstrap.sh) runs the unit tests, and ansible-test sanity of what the tarball ships; every other
# stage runs on the pinned ansible-core of .venv.
matrix() {
  local core venv claimed
  core=$(sed -n 's/^#matrix ansible-core==//p' requirements-dev.txt)
  venv="$root/.venv-${core%.*}"
  claimed=$(sed -n 's/^requires_ansible: *">=\([0-9.]*\)".*/\1/p' meta/runtime.yml)
  # The claim and the tested floor move together: requires_ansible >= X.Y.0 is tested on X.Y.
  if [ "${claimed%.*}" != "${core%.*}" ]; then
    echo "meta/runtime.yml claims ansible-core >= $claimed but the matrix tests $core: change one of them" >&2; return 1
  fi
  tests/lab/bootstrap.sh matrix
  PATH="$venv/bin:$PATH" python -c "import ansible; print('matrix: ansible-core', ansible.__version__)" >&2
  # Not the entrypoint parity tests: they run upstream's archived start-up code, the same on every ansible-core.
  PATH="$venv/bin:$PATH" pytest tests/unit -q -p no:cacheprovider -n 2 --ignore tests/unit/plugins/module_utils/_ttis/test_ttis_entrypoint_parity.py
  PATH="$venv/bin:$PATH" SANITY_SHIPPED=1 sanity
}

# Build the tarball into $1 and print its path.
build_tarball() {
  ansible-galaxy collection build --force --output-path "$1" . >/dev/null
  ls "$1"/ttfleet-inference-*.tar.gz
}

build() {
  local tmp
  tmp=$(mktemp -d "$out/build.XXXXXX")
  local tarball
  tarball=$(build_tarball "$tmp")
  # Only the installed tarball is visible from here on, not the checkout.
  export ANSIBLE_COLLECTIONS_PATH="$tmp/collections"
  ansible-galaxy collection install --force -p "$tmp/collections" "$tarball" >/dev/null
  local inst="$tmp/collections/ansible_collections/ttfleet/inference"
  test -f "$inst/MANIFEST.json"
  # What users run, and nothing of the development tooling, the lab, venvs or build products.
  local listing
  listing=$(tar -tzf "$tarball")
  # Of tests/, only what ansible-test sanity reads in an installed collection (tests/config.yml, tests/sanity/); of
  # docs/, only what an operator reads (the developer documents cite the checkout's tooling).
  if grep -E '^(\.venv[^/]*|\.ansible|\.cache|\.ci|\.config|molecule|bench|collections|inventories/lab|reports)(/|$)|^(Makefile|ansible\.cfg|pyproject\.toml|requirements-dev\.txt)$|^docs/(development|attacks|faults|benchmarks)\.md$' <<<"$listing" \
     || grep -E '^tests/' <<<"$listing" | grep -vxE 'tests/|tests/config\.yml|tests/sanity/|tests/sanity/ignore-[0-9.]+\.txt'; then
    echo "build_ignore leaks the files above into $tarball" >&2; return 1
  fi
  local f
  for f in LICENSE README.md CHANGELOG.rst requirements.txt bindep.txt meta/runtime.yml meta/execution-environment.yml \
           playbooks/site.yml playbooks/status.yml inventories/example/hosts.yml docs/awx.md changelogs/changelog.yaml \
           docs/examples/execution-environment.yml docs/examples/requirements.yml tests/config.yml tests/sanity/*.txt; do
    grep -qxF "$f" <<<"$listing" || { echo "$tarball lacks $f" >&2; return 1; }
  done
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

# Packaging as Galaxy, Automation Hub, ansible-builder and an operator see it, on the built tarball, in a directory
# outside the checkout (inside a git work tree antsibull-docs lints only the files git tracks, and an installed
# collection is not tracked: it found nothing there):
# - version_added of every plugin and option against the last release (tests/tools/version_added.py);
# - galaxy-importer with flake8 on (tests/tools/galaxy-importer.cfg): 0 errors, and only the warnings that
#   docs/development.md explains (tests/tools/importer_log.py);
# - antsibull-docs lint-collection-docs --plugin-docs on the installed collection: 0 errors;
# - ansible-lint on the installed collection with no configuration of ours, Hub's production profile: 0 failures;
# - the shipped Markdown cites only what the tarball holds, and the README lists its content (tests/tools/shipped_docs.py);
# - the README's install commands, verbatim, inside and outside a checkout (tests/tools/readme_install.py);
# - ansible-builder: `create` of the shipped docs/examples/execution-environment.yml with the tarball beside it, the
#   image's collection install step run on that context, and `introspect` of the installed collection, whose Python
#   and system requirements must be exactly the runtime files (requirements.txt, bindep.txt), never the development
#   toolchain.
# (ansible-test sanity runs on the installed tarball in the sanity and matrix stages.)
package() {
  local tmp tarball inst
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/ttfleet-package.XXXXXX")
  python tests/tools/version_added.py
  tarball=$(build_tarball "$tmp")
  local log="$tmp/galaxy-importer.log"
  (cd "$tmp" && GALAXY_IMPORTER_CONFIG="$root/tests/tools/galaxy-importer.cfg" python -m galaxy_importer.main "$tarball") \
    >"$log" 2>&1 || { tail -20 "$log" >&2; echo "galaxy-importer failed (full log: $log)" >&2; return 1; }
  ANSIBLE_COLLECTIONS_PATH="$tmp/collections" ansible-galaxy collection install -p "$tmp/collections" "$tarball" >/dev/null
  inst="$tmp/collections/ansible_collections/ttfleet/inference"
  python tests/tools/importer_log.py "$log" "$inst"
  (cd "$inst" && ANSIBLE_COLLECTIONS_PATH="$tmp/collections" antsibull-docs lint-collection-docs --plugin-docs .)
  echo "antsibull-docs lint-collection-docs --plugin-docs: 0 errors" >&2
  (cd "$inst" && ANSIBLE_COLLECTIONS_PATH="$tmp/collections" XDG_CACHE_HOME="$tmp/cache" \
     ansible-lint --offline --nocolor -q --profile production) || { echo "ansible-lint fails on the installed $(basename "$tarball")" >&2; return 1; }
  echo "ansible-lint --profile production on the installed collection: 0 failures" >&2
  python tests/tools/shipped_docs.py "$inst"
  python tests/tools/readme_install.py "$tmp/readme"
  mkdir "$tmp/ee"
  cp docs/examples/execution-environment.yml "$tarball" "$tmp/ee/"
  (cd "$tmp/ee" && ansible-builder create -f execution-environment.yml -c context --output-filename Containerfile >/dev/null)
  # The image's collection step (WORKDIR /build, the context's _build): the example's requirements reach the tarball.
  grep -q 'ansible-galaxy collection install .*-r requirements.yml' "$tmp/ee/context/Containerfile"
  (cd "$tmp/ee/context/_build" && ANSIBLE_COLLECTIONS_PATH="$tmp/ee/installed" \
     ansible-galaxy collection install -r requirements.yml --collections-path "$tmp/ee/installed" >/dev/null)
  test -f "$tmp/ee/installed/ansible_collections/ttfleet/inference/MANIFEST.json"
  echo "ansible-builder create: docs/examples/execution-environment.yml installs $(basename "$tarball")" >&2
  ansible-builder introspect --sanitize --write-pip "$tmp/pip.txt" --write-bindep "$tmp/bindep.txt" "$tmp/collections" >/dev/null
  python - "$tmp/pip.txt" "$tmp/bindep.txt" <<'PY'
import pathlib, re, sys
def reqs(path):
    p = pathlib.Path(path)
    lines = p.read_text().splitlines() if p.exists() else []
    return sorted(line.split("#")[0].strip() for line in lines if line.split("#")[0].strip())
def name(req):
    return re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower().replace("_", "-")
want_pip, want_sys = reqs("requirements.txt"), reqs("bindep.txt")
got_pip, got_sys = reqs(sys.argv[1]), reqs(sys.argv[2])
dev = {name(line) for line in reqs("requirements-dev.txt")} - {"ansible-core"}
leaked = [r for r in got_pip if name(r) in dev]
print(f"ansible-builder introspect: python {got_pip or 'none'}; system {got_sys or 'none'}", file=sys.stderr)
if leaked or [name(r) for r in got_pip] != [name(r) for r in want_pip] or [name(r) for r in got_sys] != [name(r) for r in want_sys]:
    print(f"expected only the runtime needs: python {want_pip}, system {want_sys}; development tools leaked: {leaked}",
          file=sys.stderr)
    sys.exit(1)
PY
  rm -rf "$tmp"
}

# The two ways an operator runs the collection, with nothing of the test set-up: no ANSIBLE_* variables, an empty HOME,
# only the pinned ansible-core on PATH.
# - From a checkout that never ran `make tools`: a copy of the tracked and untracked-but-not-ignored files (what a fresh
#   clone of this tree holds), whose committed collections/ link and ansible.cfg resolve ttfleet.inference.
# - From the tarball installed with `ansible-galaxy collection install -r requirements.yml`, run by FQCN from a directory
#   with no ansible.cfg.
# Each parses site, upgrade and rollback and really runs the status playbook against this machine (a local connection,
# read-only: no Tenstorrent devices, no releases), checking its report files and its set_stats summary.
entrypoints() {
  need_debs git
  local tmp
  tmp=$(mktemp -d "$out/entrypoints.XXXXXX")
  mkdir -p "$tmp/checkout" "$tmp/home" "$tmp/work"
  git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
  done | tar --null -T - -cf - | tar -C "$tmp/checkout" -xf -
  cat >"$tmp/hosts.yml" <<EOF
all:
  children:
    n150:
      hosts:
        controller:
          ansible_connection: local
          ansible_python_interpreter: $(command -v python3)
EOF
  entry_env=(env -i "PATH=$root/.venv/bin:/usr/sbin:/usr/bin:/sbin:/bin" "HOME=$tmp/home" LANG=C.UTF-8 LC_ALL=C.UTF-8
             ANSIBLE_SHOW_CUSTOM_STATS=true)
  run_entry checkout "$tmp" "$tmp/checkout" playbooks/ .yml
  local tarball
  tarball=$(cd "$tmp/checkout" && "${entry_env[@]}" ansible-galaxy collection build --output-path "$tmp" . >/dev/null \
            && ls "$tmp"/ttfleet-inference-*.tar.gz)
  printf 'collections:\n  - name: %s\n    type: file\n' "$tarball" >"$tmp/work/requirements.yml"
  entry_env+=("ANSIBLE_COLLECTIONS_PATH=$tmp/installed")
  (cd "$tmp/work" && "${entry_env[@]}" ansible-galaxy collection install -r requirements.yml -p "$tmp/installed" >/dev/null)
  run_entry installed "$tmp" "$tmp/work" ttfleet.inference.
  rm -rf "$tmp"
}

# run_entry LABEL TMP DIR PREFIX [SUFFIX]: the playbooks of one entry point, from DIR, named PREFIX<name>SUFFIX.
run_entry() {
  local label=$1 tmp=$2 dir=$3 prefix=$4 suffix=${5:-} reports="$2/reports-$1" p
  for p in site upgrade rollback prune; do
    (cd "$dir" && "${entry_env[@]}" ansible-playbook -i "$tmp/hosts.yml" "$prefix$p$suffix" --syntax-check >/dev/null)
  done
  (cd "$dir" && "${entry_env[@]}" ansible-playbook -i "$tmp/hosts.yml" "${prefix}site$suffix" --list-tasks >/dev/null)
  (cd "$dir" && "${entry_env[@]}" ansible-playbook -i "$tmp/hosts.yml" "${prefix}status$suffix" \
     -e "status_report_dir=$reports") >"$tmp/status-$label.log" 2>&1 || { cat "$tmp/status-$label.log" >&2; return 1; }
  test -s "$reports/fleet-status.json" && test -s "$reports/fleet-status.html"
  grep -q 'ttfleet_status' "$tmp/status-$label.log" || { echo "$label: the status playbook published no set_stats summary" >&2; return 1; }
  echo "entry point $label: site, upgrade, rollback and prune parse; status ran and wrote $reports" >&2
}

# What every molecule scenario and the fault suite need, made once before they run side by side: the Docker engine (a
# pristine machine installs docker.io), the lab image, the lab's TTIS repository and the Debian packages of the stages.
lab_ready() {
  need_debs zstd shellcheck rsync git debootstrap tinyproxy ssh-keygen:openssh-client
  tests/lab/ensure-docker.sh
  # The Debian 13 host of the fleet scenario (molecule/fleet: fl-n300), built beside the Debian 12 images: a
  # debootstrap is mostly waiting on the mirror.
  local trixie
  tests/lab/build-image.sh --suite trixie >/dev/null &
  trixie=$!
  tests/lab/build-image.sh >/dev/null
  tests/lab/build-image.sh --standin >/dev/null
  python tests/lab/ttis_repo.py >/dev/null
  wait "$trixie"
}

scenarios() {
  find molecule -mindepth 2 -maxdepth 2 -name molecule.yml -printf '%h\n' | xargs -n1 basename | sort
}

molecule_stage() {
  lab_ready
  local scenarios=("$@")
  [ ${#scenarios[@]} -gt 0 ] || mapfile -t scenarios < <(scenarios)
  for s in "${scenarios[@]}"; do
    timed "molecule $s" molecule test -s "$s"
  done
}

# pool JOBS -- "STAGE ..." ...: each quoted job is a run of this script (`tests/run-tests.sh STAGE ...`) in a session of
# its own with its log in tests/output/stages/; JOBS of them at a time, in the order given (longest first). The first
# failure stops the others and prints the failing log's tail; every passed stage's line is printed as its job ends.
pool() {
  local jobs=$1 logs="$out/stages" job pid name rc
  shift 2
  mkdir -p "$logs"
  local -A running=()
  local queue=("$@") failed=""
  finish() {
    local pid=$1 rc=$2 name=${running[$1]}
    unset "running[$pid]"
    grep -aE '^===== .*: (ok in|FAILED after) [0-9]+s =====$' "$logs/$name.log" >&2 || true
    passed=$((passed + $(grep -acE '^===== .*: ok in [0-9]+s =====$' "$logs/$name.log" || true)))
    if [ "$rc" -ne 0 ] && [ -z "$failed" ]; then failed=$name; fi
  }
  while [ ${#queue[@]} -gt 0 ] || [ ${#running[@]} -gt 0 ]; do
    while [ -z "$failed" ] && [ ${#queue[@]} -gt 0 ] && [ ${#running[@]} -lt "$jobs" ]; do
      job=${queue[0]}
      queue=("${queue[@]:1}")
      name=${job// /-}
      # shellcheck disable=SC2086  # a job is words: a stage and its arguments
      setsid "$0" $job >"$logs/$name.log" 2>&1 &
      running[$!]=$name
      stage "started: $job (log: ${logs#"$root"/}/$name.log)"
    done
    [ ${#running[@]} -gt 0 ] || break
    rc=0
    wait -n -p pid "${!running[@]}" || rc=$?
    finish "$pid" "$rc"
    if [ -n "$failed" ]; then
      for pid in "${!running[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
      for pid in "${!running[@]}"; do rc=0; wait "$pid" || rc=$?; finish "$pid" "$rc"; done
      queue=()
    fi
  done
  if [ -n "$failed" ]; then
    printf '\n===== the end of %s =====\n' "${logs#"$root"/}/$failed.log" >&2
    tail -n 150 "$logs/$failed.log" >&2
    echo "stages: $passed passed, 1 failed"
    exit 1
  fi
}

# `all`: the quick checks one after another (a wrong line fails in minutes), then the rest two at a time: every
# molecule scenario, the fault suite and the other checks are independent (own containers, networks, ports and state
# directories; the caches they share are made first, or locked). Most of a scenario's time is one controller core
# (ansible-playbook) waiting on its hosts, so two keep a 2-core machine busy. Longest first; TTFLEET_TEST_JOBS=1 runs
# them one at a time.
all() {
  # The Debian packages of every stage in one apt run, then the lab's set-up (a pristine machine downloads docker.io
  # and debootstraps the lab images of Debian 12 and 13: mostly network) in the background while unit, attacks and
  # hostile run (hostile's bounds hold on a loaded machine: docs/benchmarks.md, "Quick stages under load"). Lint runs
  # in the pool, with the other checks: beside the lab set-up it made the quick stages outlast it (343 s against 239 s
  # on a pristine machine), and the pool waits for both.
  timed packages need_debs zstd shellcheck rsync git debootstrap tinyproxy ssh-keygen:openssh-client
  mkdir -p "$out/stages"
  local lab_log="$out/stages/lab-set-up.log" lab_start=$SECONDS lab_rc=0
  { lab_ready; echo "$((SECONDS - lab_start))" >"$lab_log.seconds"; } >"$lab_log" 2>&1 &
  lab_pid=$!
  trap 'kill -- "$lab_pid" 2>/dev/null || true' EXIT
  timed unit unit
  timed attacks attacks
  timed hostile hostile
  wait "$lab_pid" || lab_rc=$?
  trap - EXIT
  if [ "$lab_rc" -ne 0 ]; then
    tail -n 50 "$lab_log" >&2
    printf '===== lab set-up: FAILED after %ss =====\n' "$((SECONDS - lab_start))" >&2
    echo "stages: $passed passed, 1 failed"
    exit 1
  fi
  passed=$((passed + 1))
  printf '===== lab set-up: ok in %ss (beside unit, attacks and hostile, which took %ss) =====\n' \
    "$(cat "$lab_log.seconds")" "$((SECONDS - lab_start))" >&2
  # The seconds of each scenario on the pristine check of 119879e (docs/benchmarks.md).
  local -A seconds=([upgrade]=970 [fleet]=540 [images]=370 [serve]=340 [kernel_cache]=310 [profiles]=190
                    [proxy]=190 [metrics]=150 [tt_host]=140 [inference_server]=130 [model_weights_faults]=100
                    [modules]=80)
  local jobs=() s
  # The other checks (lint ... entrypoints, about 600 s) and the fault suite (about 170 s) as jobs among the scenarios.
  jobs+=("600 lint sanity matrix build package entrypoints" "170 faults")
  while read -r s; do jobs+=("${seconds[$s]:-300} molecule $s"); done < <(scenarios)
  mapfile -t jobs < <(printf '%s\n' "${jobs[@]}" | sort -s -k1,1nr | cut -d' ' -f2-)
  pool "${TTFLEET_TEST_JOBS:-2}" -- "${jobs[@]}"
}

# The fault-injection suite (tests/faults): its fast half here; TTFLEET_FAULTS=all (make faults) runs every case
# and rewrites docs/faults.md.
faults() {
  lab_ready
  pytest tests/faults -q -p no:cacheprovider -m "faults and not slow"
}

# The stages that run alone or in a list (molecule and parallel take arguments of their own).
STAGES=" lint unit attacks hostile sanity matrix build package entrypoints faults "
is_stage() { [[ "$STAGES" == *" $1 "* ]]; }

what=${1:-all}
shift || true
if is_stage "$what"; then
  # One stage or several, one after another: tests/run-tests.sh sanity matrix build
  for s in "$what" "$@"; do
    is_stage "$s" || { echo "$s: not a stage (molecule runs on its own: tests/run-tests.sh molecule [scenario ...])" >&2; exit 2; }
  done
  for s in "$what" "$@"; do timed "$s" "$s"; done
else
  case "$what" in
    all) all ;;
    molecule) molecule_stage "$@" ;;
    parallel)
      [ $# -gt 0 ] || { echo "usage: $0 parallel JOB ... (a JOB is a stage list or 'molecule SCENARIO')" >&2; exit 2; }
      lab_ready
      pool "${TTFLEET_TEST_JOBS:-2}" -- "$@"
      ;;
    *) echo "usage: $0 all | STAGE ... | molecule [SCENARIO ...] | parallel JOB ...; a STAGE is one of$STAGES" >&2; exit 2 ;;
  esac
fi
stage "all requested checks passed"
echo "stages: $passed passed, 0 failed"
