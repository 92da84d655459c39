# `registry serve` (CONSUL_HTTP_TOKEN): registers tiered-registry (the primary, or a standalone
# registry) or tiered-registry-standby, with its gRPC check; follows nothing. With REGISTRY_HA it
# also elects the primary: a TTL check on a service of its own, a session on its node, the
# lock key and each registry's candidate entry (how far its history goes).
service "tiered-registry" {
  policy = "write"
}
service "tiered-registry-standby" {
  policy = "write"
}
service "tiered-registry-lock" {
  policy = "write"
}
session_prefix "" {
  policy = "write"
}
key_prefix "tiered/registry/" {
  policy = "write"
}
