# `registry serve` (CONSUL_HTTP_TOKEN): registers tiered-registry, with its gRPC check; follows nothing.
service "tiered-registry" {
  policy = "write"
}
