"""A node's membership of the fleet: Consul registration and discovery, and the node's background
work."""
