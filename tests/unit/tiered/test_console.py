"""The fleet console as the operator meets it: a real ``tiered console`` process over a registry
written by the registry's own code (``harness.fleet_state``: a halted wave rollout, a node down,
a failed and a refused install) and a real Alertmanager. Never anonymous, read-only, every value
from the network escaped, and at 10,000 nodes an overview of counts and a node list paged by 50."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness import fleet_state
from harness.processes import TierProcess, free_port, start_console

SCRIPT = "<script>alert('x')</script>"
ALERTMANAGER = Path("/usr/bin/prometheus-alertmanager")


def secret_of(credential: Path) -> str:
    return credential.read_text().strip()


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Alertmanager with one alert firing, whose labels carry markup."""
    if not ALERTMANAGER.exists():
        pytest.skip("needs Debian's prometheus-alertmanager")
    folder = tmp_path_factory.mktemp("alertmanager")
    (folder / "am.yml").write_text("route: {receiver: none}\nreceivers: [{name: none}]\n")
    port = free_port()
    with (folder / "am.log").open("wb") as log:
        process = subprocess.Popen(
            [str(ALERTMANAGER), f"--config.file={folder / 'am.yml'}",
             f"--storage.path={folder}", f"--web.listen-address=127.0.0.1:{port}",
             "--cluster.listen-address="], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        httpx.post(f"{url}/api/v2/alerts", timeout=5, json=[{
            "labels": {"alertname": "TieredRolloutHalted", "severity": "page",
                       "model": SCRIPT},
            "annotations": {"summary": "a wave rollout halted",
                            "runbook": "docs/alerts.md#tieredrollouthalted"}}]
                   ).raise_for_status()
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory,
          alertmanager: str) -> Iterator[tuple[TierProcess, str]]:
    folder = tmp_path_factory.mktemp("small")
    fleet_state.build(folder / "registry", 30, failed_reason=SCRIPT)
    console = start_console(folder / "registry", folder, folder / "operator.secret",
                            "--alertmanager", alertmanager, "--consul-ui",
                            "http://127.0.0.1:8500/ui", "--prometheus", "http://127.0.0.1:9090")
    try:
        yield console, secret_of(folder / "operator.secret")
    finally:
        console.stop()


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TierProcess, str]]:
    """10,000 nodes; Alertmanager given but nobody listening there."""
    folder = tmp_path_factory.mktemp("large")
    fleet_state.build(folder / "registry", 10_000)
    console = start_console(folder / "registry", folder, folder / "operator.secret",
                            "--alertmanager", f"http://127.0.0.1:{free_port()}")
    try:
        yield console, secret_of(folder / "operator.secret")
    finally:
        console.stop()


def get(console: TierProcess, path: str, secret: str | None,
        user: str = "operator") -> httpx.Response:
    return httpx.get(f"{console.url}{path}", timeout=30,
                     auth=(user, secret) if secret is not None else None)


def cells(html: str, table_id: str) -> list[list[str]]:
    """The text of each cell of the table ``table_id``, row by row (header rows left out)."""
    table = html.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r,
                                                                   re.S)]
            for r in rows if "<td" in r]


def test_the_credential_file_is_made_private_with_a_random_secret(
        small: tuple[TierProcess, str], tmp_path_factory: pytest.TempPathFactory) -> None:
    console, secret = small
    credential = console.log.parent / "operator.secret"
    assert credential.stat().st_mode & 0o777 == 0o600
    assert len(secret) >= 32
    assert "wrote a new operator secret" in console.log.read_text()
    assert secret not in console.log.read_text()  # the caller prints it, never the log


@pytest.mark.parametrize("path", ["/console/", "/console/nodes", "/console/nodes?state=failed"])
def test_without_the_right_credential_every_page_is_401_with_a_basic_challenge(
        small: tuple[TierProcess, str], path: str) -> None:
    console, secret = small
    for answer in (get(console, path, None), get(console, path, secret + "x"),
                   get(console, path, secret[:-1]), get(console, path, secret, user="admin"),
                   get(console, path, "")):
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"].startswith('Basic realm="Tiered')
        assert "sentiment" not in answer.text
    assert get(console, path, secret).status_code == 200


def test_a_malformed_authorization_header_is_401_not_an_error(
        small: tuple[TierProcess, str]) -> None:
    console, _ = small
    for header in ("Basic !!!", "Basic", "Bearer x", "basic b3BlcmF0b3I="):
        answer = httpx.get(f"{console.url}/console/", headers={"Authorization": header})
        assert answer.status_code == 401, header


def test_the_console_is_read_only_whatever_the_method(small: tuple[TierProcess, str]) -> None:
    console, secret = small
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        answer = httpx.request(method, f"{console.url}/console/", auth=("operator", secret))
        assert answer.status_code == 405, method
        assert answer.headers["allow"] == "GET, HEAD"
    head = httpx.head(f"{console.url}/console/", auth=("operator", secret))
    assert head.status_code == 200 and head.content == b""


def test_health_answers_anonymously_and_says_nothing_of_the_fleet(
        small: tuple[TierProcess, str]) -> None:
    console, _ = small
    answer = get(console, "/console/healthz", None)
    assert answer.status_code == 200 and answer.json() == {"live": True}


def test_the_overview_shows_the_halted_rollout_with_its_gate_figures(
        small: tuple[TierProcess, str]) -> None:
    console, secret = small
    html = get(console, "/console/", secret).text
    assert re.search(r'sentiment version 2 \(from 1\):\s*<span class="halted">halted</span> '
                     r'at wave 1/3', html)
    assert "reason: live audit agreement 0.550" in html
    (first, second, third) = cells(html, "rollout-1")
    assert first == ["1", "15%", "halted", "3", "3", "0", "0.55/0.9", "0/0", "20/20"]
    assert second[:3] == ["2", "50%", "-"] and third[:3] == ["3", "100%", "-"]


def test_the_overview_counts_the_down_node_and_the_failed_and_refused_installs(
        small: tuple[TierProcess, str]) -> None:
    console, secret = small
    html = get(console, "/console/", secret).text
    assert re.search(r"<b>30</b> nodes:\s*<a[^>]*>29 connected</a>,\s*<a[^>]*"
                     r'class="down">1 disconnected</a>', html)
    # site, tier, version, connected, disconnected, failed install, refused, total
    rows = {tuple(r[:3]): r[3:] for r in cells(html, "counts-sentiment")}
    assert rows[("us", "edge", "1")] == ["11", "1", "1", "0", "13"]  # edge-03 down, -07 failed
    assert rows[("eu", "edge", "1")] == ["12", "0", "0", "1", "13"]  # edge-12 refused
    assert rows[("eu", "center", "1")] == ["1", "0", "0", "0", "1"]
    assert ('href="/console/nodes?model=sentiment&amp;site=us&amp;tier=edge&amp;version=1'
            '&amp;state=disconnected"') in html


def test_the_down_node_is_one_click_away(small: tuple[TierProcess, str]) -> None:
    console, secret = small
    html = get(console, "/console/nodes?model=sentiment&site=us&tier=edge&version=1"
                        "&state=disconnected", secret).text
    (row,) = cells(html, "nodes")
    assert row[:6] == ["edge-03", "us", "edge", "sentiment", "1", "disconnected"]
    html = get(console, "/console/nodes?state=refused", secret).text
    (row,) = cells(html, "nodes")
    assert row[0] == "edge-12" and "refused: bad signature" in row[6]


def test_per_release_figures_add_up_the_nodes_last_reports(
        small: tuple[TierProcess, str]) -> None:
    console, secret = small
    (row,) = cells(get(console, "/console/", secret).text, "releases")
    # model, version, tier, nodes, rows, accuracy, agreement, drifting, input shift, low conf,
    # escalation, budget, capacity, shed, degraded
    assert row[:15] == ["sentiment", "1", "edge", "29", "8700", "88%", "90%", "0", "0.4", "-",
                        "12%", "116", "-", "0.0345%", "0%"]  # one node of 29 shed 1%


def test_the_alerts_firing_come_from_alertmanager_escaped(
        small: tuple[TierProcess, str]) -> None:
    console, secret = small
    html = get(console, "/console/", secret).text
    assert "1 firing (Alertmanager)" in html
    (row,) = cells(html, "alerts")
    assert row[:2] == ["TieredRolloutHalted", "page"]
    assert row[4] == "docs/alerts.md#tieredrollouthalted"


def test_values_from_the_network_are_escaped_everywhere(small: tuple[TierProcess, str]) -> None:
    console, secret = small
    for path in ("/console/", "/console/nodes?state=failed",
                 f"/console/nodes?site={SCRIPT}"):
        answer = get(console, path, secret)
        assert "<script" not in answer.text, path
        assert answer.headers["content-security-policy"].startswith("default-src 'none'")
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in get(
        console, "/console/nodes?state=failed", secret).text
    assert "model=&lt;script&gt;" in get(console, "/console/", secret).text  # the alert label


def test_links_go_to_consul_and_prometheus(small: tuple[TierProcess, str]) -> None:
    console, secret = small
    html = get(console, "/console/", secret).text
    assert '<a href="http://127.0.0.1:8500/ui">Consul UI</a>' in html
    assert '<a href="http://127.0.0.1:9090">Prometheus</a>' in html


def test_a_bad_filter_is_a_400_and_a_page_past_the_end_shows_the_last(
        small: tuple[TierProcess, str]) -> None:
    console, secret = small
    assert get(console, "/console/nodes?state=gone", secret).status_code == 400
    assert get(console, "/console/nodes?page=x", secret).status_code == 400
    html = get(console, "/console/nodes?page=99", secret).text
    assert "page 1 of 1 (30 shown)" in html
    assert "page 1 of 1 (0 shown)" in get(console, "/console/nodes?site=mars", secret).text


def test_at_ten_thousand_nodes_the_overview_aggregates(large: tuple[TierProcess, str]) -> None:
    console, secret = large
    html = get(console, "/console/", secret).text
    assert "<b>10000</b> nodes" in html
    assert "sim-0" not in html and "edge-03" not in html  # no row per node
    assert len(re.findall(r"<tr", html)) < 40
    rows = {tuple(r[:3]): r[3:] for r in cells(html, "counts-sentiment")}
    assert rows[("ap", "edge", "1")] == ["3326", "0", "0", "0", "3326"]


def test_at_ten_thousand_nodes_the_node_list_pages_by_fifty(
        large: tuple[TierProcess, str]) -> None:
    console, secret = large
    first = get(console, "/console/nodes", secret).text
    assert len(cells(first, "nodes")) == 50
    assert "10000 node-model pair(s)" in first and "page 1 of 200 (50 shown)" in first
    assert 'rel="next" href="/console/nodes?page=2"' in first and 'rel="prev"' not in first
    assert 'href="/console/nodes?page=200">200</a>' in first
    assert 'href="/console/nodes?page=4"' not in first  # a gap, not 200 links
    middle = get(console, "/console/nodes?page=100", secret).text
    names = [r[0] for r in cells(middle, "nodes")]
    assert len(names) == 50 and names == sorted(names)
    assert 'href="/console/nodes?page=98">98</a>' in middle
    assert 'href="/console/nodes?page=102">102</a>' in middle
    assert 'href="/console/nodes?page=103"' not in middle
    last = get(console, "/console/nodes?page=200", secret).text
    assert len(cells(last, "nodes")) == 50 and 'rel="next"' not in last
    ap = get(console, "/console/nodes?site=ap&page=67", secret).text
    assert "3326 node-model pair(s), site <b>ap</b>" in ap
    assert "page 67 of 67 (26 shown)" in ap


def test_an_alertmanager_that_does_not_answer_is_said_and_the_page_still_served(
        large: tuple[TierProcess, str]) -> None:
    console, secret = large
    answer = get(console, "/console/", secret)
    assert answer.status_code == 200
    assert re.search(r"Alertmanager at http://127\.0\.0\.1:\d+/api/v2/alerts did not answer",
                     answer.text)


def test_a_missing_registry_is_said_not_a_500(tmp_path: Path) -> None:
    console = start_console(tmp_path / "nothing", tmp_path, tmp_path / "secret")
    try:
        answer = get(console, "/console/", secret_of(tmp_path / "secret"))
        assert answer.status_code == 200
        assert "the registry database cannot be read: no registry database" in answer.text
        assert "no Alertmanager or Prometheus given" in answer.text
    finally:
        console.stop()


def test_a_given_credential_file_is_used_as_it_is(tmp_path: Path) -> None:
    """The deployment's own secret (a file it already has) is the password: nothing is
    written over it."""
    (tmp_path / "secret").write_text("the-deployment-secret\n")
    console = start_console(tmp_path / "nothing", tmp_path, tmp_path / "secret")
    try:
        assert get(console, "/console/", "the-deployment-secret").status_code == 200
        assert (tmp_path / "secret").read_text() == "the-deployment-secret\n"
        assert "wrote a new" not in console.log.read_text()
    finally:
        console.stop()


def test_links_must_be_http_urls(tmp_path: Path) -> None:
    from tiered.commands import console_argv

    argv = console_argv(tmp_path, free_port(), tmp_path / "s", "--consul-ui",
                        "javascript:alert(1)")
    done = subprocess.run(argv, capture_output=True, timeout=60)
    assert done.returncode == 2 and b"is not an http(s) URL" in done.stderr
