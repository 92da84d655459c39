# The Consul agent's own token (acl.tokens.agent): its node entry and the anti-entropy sync.
node_prefix "" {
  policy = "write"
}
service_prefix "" {
  policy = "read"
}
