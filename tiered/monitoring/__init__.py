"""Monitoring as ``tiered up`` runs it: Prometheus's targets rendered from Consul, its
configuration, and the Prometheus and Alertmanager children (their rules and receivers live in
``monitoring/``)."""
