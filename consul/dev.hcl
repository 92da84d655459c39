# The Consul agent `tiered up` runs: `consul agent -dev -config-file consul/dev.hcl` plus port
# flags (its HTTP/UI port is TIERED_CONSUL_PORT; the others are free ports). Dev mode keeps its
# state in memory: services register again after a restart (they confirm every 2 s).
# ACLs: `tiered up` adds a second config file, <root>/consul/acl.json (mode 0600, written at
# every start, never committed): ACLs on, default deny, a fresh management ("master") token and
# the agent's token. It then creates a policy and token per role from consul/policies/ (see
# tiered/stack.py); the management token is also in <root>/consul/management.token (0600).
ui = true
log_level = "WARN"
disable_update_check = true
node_name = "tiered"
bind_addr = "127.0.0.1"
client_addr = "127.0.0.1"
