"""gRPC streaming of releases from the registry to every edge and center."""

REFUSED = "refused:"
"""Prefix of a FAILED ack's reason when the node refused the release outright (missing or bad
signature, unsafe manifest): nothing was downloaded, and it is not retried; the registry audits
such an ack as action ``refused``."""
