"""gRPC streaming of releases from the registry to every edge and center."""
