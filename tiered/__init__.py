"""The local launcher: runs consul, registry, center, edges and nginx as one stack."""
