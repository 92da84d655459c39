# Read-only (CONSUL_HTTP_TOKEN of the Prometheus target renderer, tiered.monitoring.targets):
# the Tiered services and their nodes, nothing written.
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
