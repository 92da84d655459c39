# Read-only (CONSUL_HTTP_TOKEN of the nginx renderer; `tiered up`'s own health polling): the Tiered
# services (a standby registry included) and their nodes, nothing written.
service "tiered-edge" {
  policy = "read"
}
service "tiered-center" {
  policy = "read"
}
service "tiered-registry" {
  policy = "read"
}
service "tiered-registry-standby" {
  policy = "read"
}
node_prefix "" {
  policy = "read"
}
