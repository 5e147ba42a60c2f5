# ttfleet.inference: everything a contributor or a new user runs, from a fresh clone.
# Each target prepares what it needs (tests/lab/bootstrap.sh) and reuses what is already there.
SHELL := /bin/bash
export LANG := C.UTF-8
export LC_ALL := C.UTF-8
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/.ansible/collections
export PATH := $(CURDIR)/.venv/bin:$(PATH)

LAB_HOSTS ?= p300x2,n150,n300

.PHONY: demo test tools lab lab-image lab-down lint unit attacks hostile sanity matrix build package entrypoints molecule faults fresh-check clean

## demo: a simulated fleet from bare to serving: site.yml, a chat completion per instance, the fleet report
demo: tools
	tests/lab/bootstrap.sh docker
	python tests/lab/demo.py --hosts $(LAB_HOSTS)

## test: every check, in order, stopping at the first failure
test: tools
	tests/run-tests.sh all

tools:
	tests/lab/bootstrap.sh tools

lab: tools
	tests/lab/bootstrap.sh docker
	python tests/lab/lab.py up --hosts $(LAB_HOSTS)

lab-image: tools
	tests/lab/ensure-docker.sh
	tests/lab/build-image.sh --force

lab-down:
	@if [ -x .venv/bin/python ]; then python tests/lab/hf_mirror.py stop; fi
	@if [ -x .venv/bin/python ] && docker version >/dev/null 2>&1; then python tests/lab/lab.py down; fi

lint unit attacks hostile sanity matrix build package entrypoints molecule: tools
	tests/run-tests.sh $@

## faults: every fault-injection case (tests/faults), slow ones included; rewrites docs/faults.md
faults: tools
	tests/lab/bootstrap.sh docker
	TTFLEET_FAULTS=all pytest tests/faults -p no:cacheprovider -v

## fresh-check: `make demo` and `make test` from the committed HEAD in a pristine Debian 12 container (about an hour)
fresh-check:
	tests/lab/fresh-check.sh

clean: lab-down
	rm -rf .venv .venv-* .ansible .cache tests/output *.tar.gz
