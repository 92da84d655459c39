# A center (CONSUL_HTTP_TOKEN): registers tiered-center, with its HTTP check; follows the registry
# (the health API needs read on the service and on the nodes it runs on).
service "tiered-center" {
  policy = "write"
}
service "tiered-registry" {
  policy = "read"
}
node_prefix "" {
  policy = "read"
}
