#!/usr/bin/env bash
# Creates .venv and installs vgpud with its dev dependencies. Idempotent: does nothing when the
# stamp is newer than pyproject.toml. Downloads are cached under .cache/pip.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
stamp=.venv/.installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
  exit 0
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: vgpud needs Python >= 3.11 ($PYTHON is $("$PYTHON" --version 2>&1))" >&2
  exit 1
fi
if ! "$PYTHON" -m venv --help >/dev/null 2>&1 || ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then
  echo "setup: installing python3-venv" >&2
  apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
export PIP_CACHE_DIR=$PWD/.cache/pip PIP_DISABLE_PIP_VERSION_CHECK=1
echo "setup: installing vgpud and its dev dependencies into .venv" >&2
if ! .venv/bin/pip install -q -e '.[dev]' >.venv/install.log 2>&1; then
  cat .venv/install.log >&2
  echo "setup: pip install failed (log above, also in .venv/install.log)" >&2
  exit 1
fi
touch "$stamp"
