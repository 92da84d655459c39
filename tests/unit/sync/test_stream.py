"""Which ends of an open Sync stream a node counts as cut from the registry's side, and what
it logs (``sync.node.stream``); the details are those gRPC 1.8x gives (seen over loopback in
tests/integration/test_keepalive.py and a registry stopped under an open stream)."""

from __future__ import annotations

import logging

import grpc
import pytest
from prometheus_client import CollectorRegistry

from sync.node.stream import CUTS, StreamSeries, cut_reason


def error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@pytest.mark.parametrize(("code", "details", "reason"), [
    (grpc.StatusCode.UNAVAILABLE, "Too many pings", "too_many_pings"),
    (grpc.StatusCode.UNAVAILABLE, "Cancelling all calls", "unavailable"),  # registry stopped
    (grpc.StatusCode.UNAVAILABLE, "Socket closed", "unavailable"),
    (grpc.StatusCode.PERMISSION_DENIED, "this token is node 'x''s", None),
    (grpc.StatusCode.CANCELLED, "Locally cancelled by application!", None),
    (grpc.StatusCode.INVALID_ARGUMENT, "too many pings", None),  # not a transport's end
])
def test_only_unavailable_ends_are_cuts_and_too_many_pings_stands_apart(
        code: grpc.StatusCode, details: str, reason: str | None) -> None:
    assert cut_reason(error(code, details)) == reason
    assert reason is None or reason in CUTS


def test_a_cut_is_counted_only_for_an_open_stream_and_too_many_pings_says_why(
        caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    series = StreamSeries(registry, "edge")

    def cuts(reason: str) -> float | None:
        return registry.get_sample_value("edge_sync_stream_cuts_total", {"reason": reason})

    assert cuts("too_many_pings") == cuts("unavailable") == 0  # exported before any cut
    with caplog.at_level(logging.WARNING):
        series.ended("r:1", error(grpc.StatusCode.UNAVAILABLE, "failed to connect"), False)
        series.ended("r:1", error(grpc.StatusCode.UNAVAILABLE, "Too many pings"), True)
        series.ended("r:1", OSError("no route"), True)
    assert (cuts("too_many_pings"), cuts("unavailable")) == (1, 0)
    assert [r.getMessage() for r in caplog.records] == [
        "registry r:1: failed to connect",
        "registry r:1 cut the Sync stream: Too many pings (the registry permits fewer keepalive "
        "pings than this node sends: their keepalive policies differ)",
        "registry r:1: no route"]
