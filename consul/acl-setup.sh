#!/bin/sh
# Consul ACLs for Tiered: a policy per role (consul/policies/<role>.hcl) and a token per role
# with the secret given in CONSUL_<ROLE>_TOKEN; run with CONSUL_HTTP_ADDR and the management
# token in CONSUL_HTTP_TOKEN. Idempotent: policies are updated, existing tokens kept.
# docker-compose.yml runs it once Consul is up (service consul-acl); `tiered up` does the same
# through the ACL API (tiered/stack.py). Works with Consul 1.8 and later.
set -eu
dir=${TIERED_POLICIES:-$(dirname "$0")/policies}
for role in agent registry center edge reader; do
    var=CONSUL_$(echo "$role" | tr a-z A-Z)_TOKEN
    eval "secret=\${$var:-}"
    if [ -z "$secret" ]; then
        echo "acl-setup: $var is not set" >&2
        exit 2
    fi
    if consul acl policy read -name "tiered-$role" >/dev/null 2>&1; then
        consul acl policy update -name "tiered-$role" -rules "@$dir/$role.hcl" >/dev/null
    else
        consul acl policy create -name "tiered-$role" -rules "@$dir/$role.hcl" \
            -description "Tiered $role (consul/policies/$role.hcl)" >/dev/null
    fi
    if CONSUL_HTTP_TOKEN=$secret consul acl token read -self >/dev/null 2>&1; then
        echo "acl-setup: tiered-$role token exists"
    else
        consul acl token create -secret "$secret" -policy-name "tiered-$role" \
            -description "tiered-$role" >/dev/null
        echo "acl-setup: tiered-$role token created"
    fi
done
