"""High availability: leader election over Consul, the captured changes a standby applies,
and backup and restore."""
