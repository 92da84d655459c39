#!/usr/bin/env bash
# Regenerate the committed gRPC stubs (run after editing a .proto): sync/gen/ from
# sync/sync.proto, serving/gen/ from serving/grpc_predict_v2.proto (the V2 protocol). The
# virtual include paths make the stubs import each other as `sync.gen.*` / `serving.gen.*`.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m grpc_tools.protoc -Isync/gen=sync --python_out=. --pyi_out=. \
    --grpc_python_out=. sync/sync.proto
touch sync/gen/__init__.py
.venv/bin/python -m grpc_tools.protoc -Iserving/gen=serving --python_out=. --pyi_out=. \
    --grpc_python_out=. serving/grpc_predict_v2.proto
touch serving/gen/__init__.py
