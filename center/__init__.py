"""The GPU tier: full-precision TorchScript models behind the V2 escalation API."""
