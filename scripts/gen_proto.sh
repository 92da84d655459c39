#!/usr/bin/env bash
# Regenerate sync/gen/ from sync/sync.proto (the stubs are committed; run after editing the
# .proto). The virtual include path makes the stubs import each other as `sync.gen.*`.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m grpc_tools.protoc -Isync/gen=sync --python_out=. --pyi_out=. \
    --grpc_python_out=. sync/sync.proto
touch sync/gen/__init__.py
