#!/bin/sh
# Installs semhealth into a fresh virtual environment: the Dockerfile's build stages run
# this, and tests/test_image.py runs the same script, so what the test starts is what the
# image holds.
#
#   docker/install.sh VENV SOURCE [EXTRAS] [PRE_INSTALL...]
#
# VENV: where the environment goes; SOURCE: the project folder; EXTRAS: e.g. "local,scorer"
# (empty: the sidecar, no torch); PRE_INSTALL: requirements installed first (the scorer's
# torch build, so the extras do not pull another one).
set -eu
venv=$1
source=$2
extras=${3:-}
shift 2
if [ $# -gt 0 ]; then
    shift  # the extras; what is left is PRE_INSTALL
fi
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
if [ $# -gt 0 ]; then
    "$venv/bin/pip" install --quiet "$@"
fi
if [ -n "$extras" ]; then
    "$venv/bin/pip" install --quiet "$source[$extras]"
else
    "$venv/bin/pip" install --quiet "$source"
fi
# Bytecode now, so a read-only root filesystem never needs a write at run time.
"$venv/bin/python" -m compileall -q "$venv" >/dev/null
