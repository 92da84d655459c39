"""The one answer to an exception, and the one handler of ``POST .../infer`` however the path is
spelled; with the test data plane of ``test_dataplane``."""

from __future__ import annotations

import logging

import pytest
from litestar.exceptions import MethodNotAllowedException
from litestar.testing import TestClient

from serving.config.settings import ServingSettings
from serving.errors import ModelNotFound, Overloaded, ServingError
from serving.transport.responses import INTERNAL, error_response
from serving.transport.rest import create_app
from tests.unit.serving.test_dataplane import BODY, plane

log = logging.getLogger("test")


def test_serving_errors_keep_their_status_message_and_headers() -> None:
    answer = error_response(Overloaded("queue full", retry_after=2), log)
    assert (answer.status, answer.message, dict(answer.headers)) == (
        503, "queue full", {"Retry-After": "2"})
    assert answer.body == b'{"error":"queue full"}'
    assert error_response(ModelNotFound("no such model"), log).status == 404
    assert error_response(ServingError("plain"), log).status == 500


def test_framework_errors_keep_their_status_and_headers() -> None:
    answer = error_response(MethodNotAllowedException(headers={"Allow": "POST"}), log)
    assert (answer.status, answer.message, dict(answer.headers)) == (
        405, "Method Not Allowed", {"Allow": "POST"})


def test_unexpected_errors_are_logged_and_never_shown(caplog: pytest.LogCaptureFixture) -> None:
    answer = error_response(RuntimeError("/opt/secret.py line 42"), log)
    assert (answer.status, answer.message, dict(answer.headers)) == (500, INTERNAL, {})
    assert "secret" not in answer.body.decode()
    assert caplog.records[-1].exc_info is not None


@pytest.mark.parametrize("path", ["/v2/models/sentiment/infer", "/v2/models/sentiment/infer/",
                                  "/v2//models/sentiment/versions/1/infer"])
def test_every_spelling_of_an_infer_path_reaches_the_one_handler(path: str) -> None:
    p, tier = plane()
    with TestClient(create_app(p)) as client:
        answer = client.post(path, content=BODY, headers={"x-request-id": "r-1"})
        assert answer.status_code == 200 and answer.json()["id"] == "r1"
        assert answer.headers["x-request-id"] == "r-1"
        missing = client.post(path.replace("sentiment", "nope"), content=BODY)
        assert missing.status_code == 404 and set(missing.json()) == {"error"}
        assert client.put(path).status_code == 405
    assert len(tier.parsed) == 1


def test_a_route_and_the_infer_handler_answer_an_error_alike() -> None:
    p, _ = plane()
    with TestClient(create_app(p)) as client:
        route = client.get("/v2/models/nope")
        handler = client.post("/v2/models/nope/infer", content=BODY)
    assert route.status_code == handler.status_code == 404
    assert route.headers["content-type"] == handler.headers["content-type"] == "application/json"
    assert route.json() == handler.json() == {"error": "model 'nope' has no version None"}


def access_logged(caplog: pytest.LogCaptureFixture, access_log: bool) -> tuple[list[str], str]:
    """What the access log said (and /metrics) for 3 passing probes, an inference, a 404, an
    inference that fails with a 500 and a failing readiness probe."""
    p, tier = plane()
    tier.settings = ServingSettings(access_log=access_log)
    failing, _ = plane(fail=RuntimeError("boom"))
    failing.service.settings = tier.settings  # type: ignore[misc]
    not_ready, _ = plane(loaded=False)
    not_ready.service.settings = tier.settings  # type: ignore[misc]
    with caplog.at_level(logging.INFO, logger="serving.access"), \
            TestClient(create_app(p)) as client:
        for _ in range(3):
            assert client.get("/v2/health/live").status_code == 200
        assert client.post("/v2/models/sentiment/infer", content=BODY).status_code == 200
        assert client.get("/v2/models/nope").status_code == 404
        scraped = client.get("/metrics").text
        with TestClient(create_app(failing)) as broken:
            assert broken.post("/v2/models/sentiment/infer", content=BODY).status_code == 500
        with TestClient(create_app(not_ready)) as empty:
            assert empty.get("/v2/health/ready").status_code == 503
    return [r.getMessage() for r in caplog.records if r.name == "serving.access"], scraped


def test_with_the_access_log_on_requests_are_logged_and_probes_counted_not_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """Consul's checks and nginx's probes every few seconds would bury the lifecycle: a
    passing probe is a debug line and a count in /metrics; a failing probe, an inference and
    a 404 stay in the log."""
    logged, scraped = access_logged(caplog, access_log=True)
    assert not any("/v2/health/live" in line or "/metrics" in line for line in logged), logged
    assert any("POST /v2/models/sentiment/infer 200" in line for line in logged), logged
    assert any("GET /v2/models/nope 404" in line for line in logged), logged
    assert any("POST /v2/models/sentiment/infer 500" in line for line in logged), logged
    assert any("GET /v2/health/ready 503" in line for line in logged), logged  # news
    assert 'test_probe_requests_total{path="/v2/health/live",status="200"} 3.0' in scraped


def test_with_the_access_log_off_by_default_only_server_faults_are_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """Off (the default, as in Triton): no line for an answered request, a client's 4xx or a
    passing probe; a 500 and a failing readiness probe (5xx) are still logged, and probes
    still counted."""
    assert ServingSettings().access_log is False
    logged, scraped = access_logged(caplog, access_log=False)
    assert not any(" 200" in line or " 404" in line for line in logged), logged
    assert any("POST /v2/models/sentiment/infer 500" in line for line in logged), logged
    assert any("GET /v2/health/ready 503" in line for line in logged), logged
    assert 'test_probe_requests_total{path="/v2/health/live",status="200"} 3.0' in scraped
