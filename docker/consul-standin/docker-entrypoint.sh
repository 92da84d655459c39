#!/bin/sh
# The official hashicorp/consul entry point's contract, for Consul 1.8: CONSUL_LOCAL_CONFIG is
# written to /consul/config/local.json; `agent ...` runs `consul agent` with the data and config
# folders; any other consul subcommand runs as `consul ...`; the agent runs as user consul.
set -e
if [ -n "${CONSUL_LOCAL_CONFIG:-}" ]; then
    # Consul 1.8 names the bootstrap management token "master" (1.11 renamed it
    # "initial_management", which docker-compose.yml uses for the official image).
    printf '%s\n' "$CONSUL_LOCAL_CONFIG" \
        | sed 's/"initial_management"/"master"/' > /consul/config/local.json
fi
case "${1:-}" in
    -*) set -- consul "$@" ;;
    agent) shift; set -- consul agent -data-dir=/consul/data -config-dir=/consul/config "$@" ;;
    consul) ;;
    *) if consul "$1" -h 2>&1 | grep -q "consul $1"; then set -- consul "$@"; fi ;;
esac
if [ "$1" = consul ] && [ "$(id -u)" = 0 ]; then
    chown -R consul /consul/data /consul/config
    exec setpriv --reuid=consul --regid=consul --init-groups "$@"
fi
exec "$@"
