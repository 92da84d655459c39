#!/usr/bin/env bash
# The center's GPU path, prepared for a machine with an NVIDIA GPU (none is lent to this
# project's CI): installs what is missing, builds/publishes the demo release if needed, then
# measures the center on CUDA, fp32 vs fp16, concurrency 1..256 (bench/gpu.py).
#
#   bash bench/gpu.sh [--duration 10] [--bf16] [--markdown docs/bench/gpu.md]
#
# torch==2.13.0 from PyPI is the CUDA build on Linux x86_64, so the ordinary set-up is all the
# center needs; the host needs only the NVIDIA driver.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "bench/gpu.sh: no nvidia-smi, no GPU here" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
[ -x .venv/bin/python ] || bash scripts/bootstrap.sh
.venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else
    "torch in .venv has no CUDA: reinstall torch==2.13.0 from the default PyPI index")'
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
.venv/bin/registry list --json | grep -q '"sentiment"' || make demo
exec .venv/bin/python -m bench.gpu "$@"
