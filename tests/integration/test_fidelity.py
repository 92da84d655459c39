"""Every node checks a release's INT8 fidelity on its own hardware before it serves it.

A real ``registry serve`` and edges on loopback. Version 2's edge model is built so that INT8
cannot keep its labels (its two logits differ by far less than weight rounding): published with
``--force``, its release floor is still 97%, so a node with the release's floor refuses it on
any CPU and keeps serving version 1; a node whose own floor is 0 accepts the same version.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from examples.sentiment.release import EDGE
from harness.processes import RegistryProcess, start_registry
from tests.conftest import RegistryCli
from tests.integration.test_sync import (
    SYNC_FLAGS,
    TOKEN,
    metric,
    node_id,
    served,
    status,
    wait_for,
)
from tests.models import fragile_classifier, save_script
from tests.servers import Server, start

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BODY = json.dumps({"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES",
                               "data": ["a great film", "dull"]}]})
RELEASE_FLOOR = 0.97


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory,
             tiny_release: Path) -> Iterator[tuple[RegistryCli, RegistryProcess, Path]]:
    root = tmp_path_factory.mktemp("fidelity")
    cli = RegistryCli(root / "registry")
    cli("publish", tiny_release, "--name", "tiny")  # version 1: the tiny release
    process = start_registry(cli.home, root, TOKEN, env={"REGISTRY_REPORT_INTERVAL_S": "0.5"})
    try:
        yield cli, process, root
    finally:
        process.stop()


def fragile_release(tiny_release: Path, folder: Path) -> Path:
    shutil.copytree(tiny_release, folder)
    save_script(fragile_classifier(), folder / EDGE)
    return folder


def infer_version(server: Server) -> str:
    answer = httpx.post(f"{server.url}/v2/models/tiny/infer", content=BODY, timeout=10)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["model_version"])


def test_a_node_refuses_a_version_below_its_floor_and_one_with_a_lower_floor_serves_it(
        registry: tuple[RegistryCli, RegistryProcess, Path], tiny_release: Path) -> None:
    cli, process, root = registry
    servers: list[Server] = []
    try:
        strict = start("edge", root / "strict", root, "--registry", process.target,
                       *SYNC_FLAGS, registry_secret=TOKEN)
        servers.append(strict)
        wait_for(lambda: served(strict) == 1, what="the edge on version 1")

        forced = cli("publish", fragile_release(tiny_release, root / "fragile"), "--name",
                     "tiny", "--min-fidelity", str(RELEASE_FLOOR), "--force",
                     "--json").json()["manifest"]
        assert forced["version"] == 2 and forced["fidelity"]["forced"]
        assert forced["fidelity"]["minimum"] == RELEASE_FLOOR

        def refused() -> bool:
            row = status(cli).get(node_id(strict), {})
            return row.get("state") == "FAILED" and row.get("fidelity_version") == 2

        wait_for(refused, what="the edge refusing version 2")
        row = status(cli)[node_id(strict)]
        assert row["version"] == 1 and row["lagging"]  # still serving version 1
        assert row["reason"].startswith("version 2: refused: fidelity ")
        assert f"below the {RELEASE_FLOOR:.1%} floor" in row["reason"]
        assert row["fidelity"] < RELEASE_FLOOR and row["fidelity_rows"] == 200
        assert row["cpu"] and row["machine"] and isinstance(row["cpu_features"], list)
        assert row["runtime"].startswith("onnxruntime ")
        assert served(strict) == 1 and infer_version(strict) == "1"
        assert metric(f"{strict.url}/metrics", "edge_model_fidelity",
                      version="2") == pytest.approx(row["fidelity"])

        (audit,) = [r for r in cli("audit", "--json").json()
                    if r["action"] == "refused" and r["version"] == 2]
        payload = json.loads(audit["payload"])
        assert audit["actor"] == f"node:{node_id(strict)}"
        assert payload["state"] == "FAILED" and payload["fidelity"] == row["fidelity"]
        assert payload["platform"]["features"] == row["cpu_features"]
        cli("audit", "--verify")

        lenient = start("edge", root / "lenient", root, "--registry", process.target,
                        *SYNC_FLAGS, "--min-fidelity", "0", registry_secret=TOKEN)
        servers.append(lenient)
        wait_for(lambda: served(lenient) == 2, what="the lenient edge on version 2")
        assert infer_version(lenient) == "2"
        accepted = status(cli)[node_id(lenient)]
        assert (accepted["state"], accepted["version"]) == ("ACTIVE", 2)
        # same CPU, same probe, same model: the same figure the strict edge refused
        assert accepted["fidelity"] == row["fidelity"] and accepted["fidelity_version"] == 2
        assert served(strict) == 1  # the refusal holds: no retry loop moved it meanwhile
    finally:
        for server in servers:
            server.stop()
