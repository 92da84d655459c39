#!/usr/bin/env bash
# Install the two non-Python parts of the stack when missing (idempotent, no system apt source
# is changed):
#   consul — Debian bookworm has none; bullseye's consul 1.8.7 package carries the binary and
#            its web UI. The .deb is fetched with a private one-line source list and unpacked;
#            only usr/bin/consul is kept, as .venv/bin/consul.
#   nginx  — nginx-light from Debian (apt-get; root or password-less sudo).
#   qemu   — qemu-user from Debian, x86-64 only: the tests run the INT8 fidelity probe under
#            `qemu-x86_64 -cpu Haswell` (AVX2, no VNNI), a CPU class the machine may not be.
#   iproute2, iptables — as root, when missing: `tiered sites` makes each host a network
#            namespace (ip, tc, iptables); its tests skip without root.
#   prometheus, prometheus-alertmanager — Debian's (2.42 and 0.25): the stack's monitoring;
#            `make test` runs promtool and amtool on monitoring/ (docs/alerts.md).
#   chromium, chromium-driver — Debian's: the fleet console's browser test (selenium).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
mkdir -p "$BIN"

sudo_if_needed() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }

if [ ! -x "$BIN/consul" ]; then
    if command -v consul >/dev/null 2>&1; then
        ln -sf "$(command -v consul)" "$BIN/consul"
    else
        echo "install_tools: fetching consul from Debian bullseye" >&2
        work=$(mktemp -d)
        trap 'rm -rf "$work"' EXIT
        uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null \
              || true)
        uri=${uri:-http://deb.debian.org/debian}
        echo "deb $uri bullseye main" > "$work/sources.list"
        mkdir -p "$work/lists/partial"
        opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
              -o "Dir::State::Lists=$work/lists" -o "APT::Get::List-Cleanup=0"
              -o "APT::Sandbox::User=root")
        apt-get "${opts[@]}" update -qq
        (cd "$work" && apt-get "${opts[@]}" download consul -qq)
        dpkg -x "$work"/consul_*.deb "$work/root"
        install -m 0755 "$work/root/usr/bin/consul" "$BIN/consul"
    fi
fi

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    echo "install_tools: installing nginx-light from Debian" >&2
    sudo_if_needed apt-get update -qq
    sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null
fi
if [ "$(id -u)" = 0 ] && { ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1 \
        || ! command -v iptables >/dev/null 2>&1; }; then
    echo "install_tools: installing iproute2 and iptables from Debian" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 \
        iptables >/dev/null
fi
if [ "$(uname -m)" = x86_64 ] && ! command -v qemu-x86_64 >/dev/null 2>&1; then
    echo "install_tools: installing qemu-user from Debian" >&2
    sudo_if_needed apt-get update -qq
    sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends qemu-user >/dev/null
fi
# Where systemd runs, Debian's postinst enables and starts prometheus and
# prometheus-alertmanager as services on 9090 and 9093 with Debian's own configuration: the
# ports `tiered up` uses for its own. Tiered never uses those services, so the ones installed
# here are stopped and disabled right after (a Prometheus already installed is left alone).
# In a container (no init, or a policy-rc.d that forbids starts) nothing is started.
missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || [ -x /usr/bin/prometheus-alertmanager ] \
    || missing+=(prometheus-alertmanager)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
if [ ${#missing[@]} -gt 0 ]; then
    echo "install_tools: installing ${missing[*]} from Debian" >&2
    sudo_if_needed apt-get update -qq
    sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null
    if [ -d /run/systemd/system ]; then
        for unit in prometheus prometheus-alertmanager; do
            case " ${missing[*]} " in
                *" $unit "*) sudo_if_needed systemctl disable --now "$unit" >/dev/null 2>&1 \
                    && echo "install_tools: stopped Debian's $unit service (tiered up runs its own)" >&2 ;;
            esac
        done
    fi
fi
"$BIN/consul" version | sed -n 1p >&2  # sed reads it all: no SIGPIPE (exit 141) under pipefail
