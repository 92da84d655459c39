# An edge (CONSUL_HTTP_TOKEN): registers tiered-edge, with its HTTP check; follows the centers it
# escalates to and the registry it syncs from.
service "tiered-edge" {
  policy = "write"
}
service "tiered-center" {
  policy = "read"
}
service "tiered-registry" {
  policy = "read"
}
node_prefix "" {
  policy = "read"
}
