#!/usr/bin/env bash
# Run the demo center (:8100) and one edge (:8200) in the foreground; Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
$BIN/center --store var/center --port "${CENTER_PORT:-8100}" &
center=$!
$BIN/edge --store var/edge --port "${EDGE_PORT:-8200}" \
    --center-url "${EDGE_CENTER_URL:-http://127.0.0.1:${CENTER_PORT:-8100}}" &
edge=$!
trap 'kill $edge $center 2>/dev/null; wait' INT TERM EXIT
echo "center: http://127.0.0.1:${CENTER_PORT:-8100}  edge: http://127.0.0.1:${EDGE_PORT:-8200}" >&2
wait -n $center $edge
