#!/usr/bin/env bash
# Run `registry serve` (:50051, metrics :9300), the demo center (:8100) and one edge (:8200) in
# the foreground; both tiers subscribe to the registry and install what it rolls out.
# Ctrl-C stops all three.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
export REGISTRY_TOKEN="${REGISTRY_TOKEN:-$($BIN/python -c 'import secrets; print(secrets.token_hex(16))')}"
GRPC="${REGISTRY_GRPC_PORT:-50051}"
# Both tiers accept only releases signed with the registry's key (created on first use).
RELEASE_KEY="$($BIN/registry key --path)"
$BIN/registry sign sentiment > /dev/null  # a registry from before signing: sign what it holds
$BIN/registry serve --port "$GRPC" &
registry=$!
# each node has its own token, derived from the registry's secret (it proves that node only);
# secrets go in the environment, never on a command line
REGISTRY_TOKEN="$($BIN/registry node token center-1)" \
$BIN/center --store var/center --port "${CENTER_PORT:-8100}" --registry "127.0.0.1:$GRPC" \
    --node-id center-1 --release-key "$RELEASE_KEY" &
center=$!
REGISTRY_TOKEN="$($BIN/registry node token edge-1)" \
$BIN/edge --store var/edge --port "${EDGE_PORT:-8200}" --registry "127.0.0.1:$GRPC" \
    --node-id edge-1 --release-key "$RELEASE_KEY" \
    --center-url "${EDGE_CENTER_URL:-http://127.0.0.1:${CENTER_PORT:-8100}}" &
edge=$!
trap 'kill $edge $center $registry 2>/dev/null; wait' INT TERM EXIT
cat >&2 <<EOM
signing:  releases must be signed with $RELEASE_KEY's private half
registry: 127.0.0.1:$GRPC (gRPC sync; metrics http://127.0.0.1:${REGISTRY_METRICS_PORT:-9300}/metrics)
center:   http://127.0.0.1:${CENTER_PORT:-8100}
edge:     http://127.0.0.1:${EDGE_PORT:-8200}
rollout:  .venv/bin/registry publish var/demo/release --name sentiment   (another terminal)
status:   .venv/bin/registry status
EOM
wait -n $registry $center $edge
