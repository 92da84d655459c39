#!/bin/sh
# Consul ACLs for Tiered: a policy per role (consul/policies/<role>.hcl) and a token per role
# with the secret given in CONSUL_<ROLE>_TOKEN (or in the file CONSUL_<ROLE>_TOKEN_FILE
# names); run with CONSUL_HTTP_ADDR and the management token in CONSUL_HTTP_TOKEN (or in the
# file CONSUL_HTTP_TOKEN_FILE names). Idempotent: policies are updated, existing tokens kept.
# docker-compose.yml runs it once Consul is up (service consul-acl); `tiered up` does the same
# through the ACL API (tiered/stack.py). Works with Consul 1.8 and later.
#
# No secret ever appears in a process's argv (`ps` shows argv to every user): the script talks
# to Consul's HTTP ACL API with curl (7.55 or later), which reads every header that holds a
# token and every request body from a 0600 file or from its stdin, written by the shell's
# built-in printf. Needs sh, curl, sed, awk, tr, grep, mktemp (all in the official Consul image
# and in docker/consul-standin).
set -eu
dir=${TIERED_POLICIES:-$(dirname "$0")/policies}
addr=${CONSUL_HTTP_ADDR:-127.0.0.1:8500}
case $addr in
    http://* | https://*) ;;
    *) if [ "${CONSUL_HTTP_SSL:-false}" = true ]; then addr=https://$addr; else addr=http://$addr; fi ;;
esac
tls=
if [ -n "${CONSUL_CACERT:-}" ]; then tls=--cacert; fi

fail() {
    echo "acl-setup: $*" >&2
    exit "${code_on_fail:-1}"
}

# A token goes into an HTTP header and a JSON body: only what a Consul token is made of (UUIDs).
check_secret() {  # name value
    case $2 in
        "") code_on_fail=2 fail "$1 is not set" ;;
        *[!0-9A-Za-z-]*) code_on_fail=2 fail "$1 must be a UUID (letters, digits and -)" ;;
    esac
}

management=${CONSUL_HTTP_TOKEN:-}
if [ -n "${CONSUL_HTTP_TOKEN_FILE:-}" ]; then
    IFS= read -r management <"$CONSUL_HTTP_TOKEN_FILE" || [ -n "$management" ] \
        || code_on_fail=2 fail "cannot read CONSUL_HTTP_TOKEN_FILE $CONSUL_HTTP_TOKEN_FILE"
fi
check_secret CONSUL_HTTP_TOKEN "$management"
# Each role's token: CONSUL_<ROLE>_TOKEN, or the file CONSUL_<ROLE>_TOKEN_FILE names (Docker
# secrets, deploy/swarm/stack.yml); read once, kept in the shell's own variables.
# prometheus (the target renderer's read-only token) is optional: a deployment without
# Prometheus sets none.
roles="agent registry center edge reader"
if [ -n "${CONSUL_PROMETHEUS_TOKEN:-}${CONSUL_PROMETHEUS_TOKEN_FILE:-}" ]; then
    roles="$roles prometheus"
fi
for role in $roles; do
    var=CONSUL_$(echo "$role" | tr a-z A-Z)_TOKEN
    eval "file=\${${var}_FILE:-}"
    if [ -n "$file" ]; then
        IFS= read -r secret <"$file" || [ -n "$secret" ] \
            || code_on_fail=2 fail "cannot read ${var}_FILE $file"
        eval "$var=\$secret"
    fi
    eval "secret=\${$var:-}"
    check_secret "$var" "$secret"
done

umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM
printf 'X-Consul-Token: %s\n' "$management" >"$tmp/management"  # 0600 (umask)

# api METHOD PATH [HEADER-FILE]: the answer's status on stdout, its body in $tmp/answer; the
# request body, if any, on stdin. HEADER-FILE "-" takes the token header from stdin instead.
api() {
    code=$(curl -sS ${tls:+"$tls"} ${tls:+"$CONSUL_CACERT"} -o "$tmp/answer" -w '%{http_code}' \
        -X "$1" -H "@${3:-$tmp/management}" ${body:+--data-binary} ${body:+@-} \
        "$addr/v1$2") || code=000
    echo "$code"
}

# A file's text as a JSON string's contents (the policies are ours: no control characters
# other than tabs).
json_text() {
    tab=$(printf '\t')
    tr -d '\r' <"$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e "s/$tab/\\\\t/g" \
        | awk '{ printf "%s\\n", $0 }'
}

for role in $roles; do
    var=CONSUL_$(echo "$role" | tr a-z A-Z)_TOKEN
    eval "secret=\${$var}"
    name=tiered-$role
    [ -f "$dir/$role.hcl" ] || fail "no policy file $dir/$role.hcl"
    policy="{\"Name\": \"$name\", \"Description\": \"Tiered $role (consul/policies/$role.hcl)\", \"Rules\": \"$(json_text "$dir/$role.hcl")\"}"
    found=$(body='' api GET "/acl/policy/name/$name")
    if [ "$found" = 200 ]; then
        id=$(grep -o '"ID": *"[0-9a-f-]*"' "$tmp/answer" | head -n 1 | sed 's/.*"\([0-9a-f-]*\)"$/\1/')
        [ -n "$id" ] || fail "policy $name: no ID in Consul's answer"
        code=$(printf '%s' "$policy" | body=1 api PUT "/acl/policy/$id")
    else
        code=$(printf '%s' "$policy" | body=1 api PUT /acl/policy)
    fi
    [ "$code" = 200 ] || fail "policy $name: Consul answered $code: $(head -c 300 "$tmp/answer")"

    code=$(printf 'X-Consul-Token: %s\n' "$secret" | body='' api GET /acl/token/self -)
    if [ "$code" = 200 ]; then
        echo "acl-setup: $name token exists"
    else
        code=$(printf '{"SecretID": "%s", "Description": "%s", "Policies": [{"Name": "%s"}]}' \
            "$secret" "$name" "$name" | body=1 api PUT /acl/token)
        [ "$code" = 200 ] || fail "token $name: Consul answered $code: $(head -c 300 "$tmp/answer")"
        echo "acl-setup: $name token created"
    fi
done
