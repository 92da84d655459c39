"""``registry serve``: the gRPC services (Sync, Fetch, Replication), what nodes send up, the
registry's metrics and limits, and the process that runs them by role."""
