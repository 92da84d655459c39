#!/bin/sh
# The secrets docker-compose.yml requires, appended to ./.env (mode 0600; never commit it):
# REGISTRY_TOKEN, a Consul token per role (UUIDs: Consul's format for a token's secret) and the
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
for role in MANAGEMENT AGENT REGISTRY CENTER EDGE READER; do
    add "CONSUL_${role}_TOKEN" "$(uuid)"
done
add CONSUL_ENCRYPT_KEY "$(python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())')"
echo "secrets in $file (mode 600); the Consul UI login is CONSUL_MANAGEMENT_TOKEN"
