"""Every process's /metrics carries its CPU and memory (``process_*``, the dashboard's
resources panels): a tier's, also when several workers share its port, and the registry's."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from registry.server.metrics import SyncMetrics
from serving.telemetry.metrics import Metrics


def values(text: bytes) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(text.decode())
            for s in f.samples}


def test_a_tiers_metrics_show_its_cpu_and_resident_memory() -> None:
    found = values(generate_latest(Metrics("edge").registry))
    assert found["process_resident_memory_bytes"] > 1 << 20  # a Python process: megabytes
    assert found["process_cpu_seconds_total"] > 0


def test_the_registrys_metrics_show_its_cpu_and_resident_memory() -> None:
    found = values(SyncMetrics().exposition())
    assert found["process_resident_memory_bytes"] > 1 << 20
    assert found["process_open_fds"] >= 3
