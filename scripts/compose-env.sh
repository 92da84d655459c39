#!/bin/sh
# The secrets docker-compose.yml requires, appended to ./.env (mode 0600; never commit it):
# REGISTRY_TOKEN, each node's registry token derived from it, a Consul token per role (UUIDs: Consul's format for a token's secret) and the
# gossip encryption key (32 random bytes, base64, what `consul keygen` prints). A variable
# already in the file is kept.
#
#   sh scripts/compose-env.sh [FILE]      (default: .env)
set -eu
file=${1:-.env}
umask 077
touch "$file"
chmod 600 "$file"
uuid() { python3 -c 'import uuid; print(uuid.uuid4())'; }
add() {
    grep -q "^$1=" "$file" || echo "$1=$2" >> "$file"
}
add REGISTRY_TOKEN "$(python3 -c 'import secrets; print(secrets.token_hex(32))')"
for role in MANAGEMENT AGENT REGISTRY CENTER EDGE READER PROMETHEUS; do
    add "CONSUL_${role}_TOKEN" "$(uuid)"
done
add CONSUL_ENCRYPT_KEY "$(python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())')"
# Each node's own registry token, derived from REGISTRY_TOKEN by the project's serving/config/tokens.py
# (standard library only): it proves that node id, its tier and its region (as in
# docker-compose.yml) and no other. Recomputed on every run, so a changed REGISTRY_TOKEN gives
# new ones (generation 1; after `registry node revoke`, print the new one with
# `docker compose exec registry registry node token NODE_ID --tier T --region R`).
root=$(cd "$(dirname "$0")/.." && pwd)
secret=$(sed -n 's/^REGISTRY_TOKEN=//p' "$file" | tail -n 1)
for spec in center-eu-1:center:eu edge-eu-1:edge:eu edge-us-1:edge:us; do
    node=${spec%%:*}
    tier=${spec#*:}; tier=${tier%%:*}
    region=${spec##*:}
    var="TIERED_$(echo "$node" | tr 'a-z-' 'A-Z_')_TOKEN"
    token=$(REGISTRY_TOKEN="$secret" PYTHONPATH="$root" python3 -c \
        'import os, sys; from serving.config.tokens import node_token; print(node_token(os.environ["REGISTRY_TOKEN"], *sys.argv[1:]))' "$node" "$tier" "$region")
    grep -v "^$var=" "$file" > "$file.tmp" || true
    echo "$var=$token" >> "$file.tmp"
    mv "$file.tmp" "$file"
    chmod 600 "$file"
done
echo "secrets in $file (mode 600); the Consul UI login is CONSUL_MANAGEMENT_TOKEN"
