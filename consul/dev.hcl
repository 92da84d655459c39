# The Consul agent `tiered up` runs: `consul agent -dev -config-file consul/dev.hcl` plus port
# flags (its HTTP/UI port is TIERED_CONSUL_PORT; the others are free ports). Dev mode keeps its
# state in memory: services register again after a restart (they confirm every 2 s).
ui = true
log_level = "WARN"
disable_update_check = true
node_name = "tiered"
bind_addr = "127.0.0.1"
client_addr = "127.0.0.1"
