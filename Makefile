# ttfleet.inference: everything a contributor or a new user runs, from a fresh clone.
# Each target prepares what it needs (tests/lab/bootstrap.sh) and reuses what is already there.
SHELL := /bin/bash
export LANG := C.UTF-8
export LC_ALL := C.UTF-8
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/.ansible/collections
export PATH := $(CURDIR)/.venv/bin:$(PATH)

LAB_HOSTS ?= n150,p150x4,p300x2

.PHONY: demo test tools lab lab-image lab-down lint unit sanity build molecule clean

## demo: start the simulated lab and run site.yml against it
demo: tools
	tests/lab/bootstrap.sh docker
	python tests/lab/lab.py up --hosts $(LAB_HOSTS)
	ansible-playbook -i inventories/lab site.yml

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
	@if [ -x .venv/bin/python ] && docker version >/dev/null 2>&1; then python tests/lab/lab.py down; fi

lint unit sanity build molecule: tools
	tests/run-tests.sh $@

clean: lab-down
	rm -rf .venv .ansible .cache tests/output *.tar.gz
