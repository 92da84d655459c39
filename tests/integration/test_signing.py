"""Signed releases end to end: ``registry publish`` signs, ``registry pull`` keeps the signed
bytes, a node given the registry's public key refuses what that key did not sign (pushed
releases and its own store alike), and ``registry publish`` refuses release folders that reach
outside themselves.

The tests share one registry home and run in file order (version numbers in the comments).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import msgspec
import pytest

from harness.processes import BIN, start_registry, start_tier
from registry.settings import RegistrySettings
from registry.trust import keys
from serving.release.signing import Verifier, load_public_key
from serving.release.store import InstalledReleases
from tests.conftest import RegistryCli
from tests.integration.test_sync import (
    BODY,
    SYNC_FLAGS,
    TOKEN,
    node_id,
    node_metric,
    served,
    status,
    wait_for,
)
from tests.integration.test_trust import list_behind_the_registry
from tests.servers import start

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass
class Home:
    root: Path
    cli: RegistryCli

    def key(self) -> dict[str, str]:
        data: dict[str, str] = self.cli("key", "--json").json()
        return data


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Home:
    root = tmp_path_factory.mktemp("signing")
    cli = RegistryCli(root / "registry")
    cli("publish", tiny_release, "--name", "tiny")  # version 1, signed with the default key
    return Home(root, cli)


def test_publish_signs_and_a_pulled_store_verifies(home: Home) -> None:
    key = home.key()
    assert (Path(key["private_key_path"]).stat().st_mode & 0o777) == 0o600
    shown = home.cli("show", "tiny@1", "--json").json()
    assert shown["signing_key_id"] == key["key_id"] and shown["signature"]
    (publish,) = [r for r in home.cli("audit", "--json").json() if r["action"] == "publish"]
    assert json.loads(publish["payload"])["key_id"] == key["key_id"]
    store = home.root / "pulled"
    home.cli("pull", "tiny@1", "--tier", "edge", "--store", store)
    folder = store / "tiny" / "1"
    assert hashlib.sha256((folder / "release.json").read_bytes()).hexdigest() == \
        shown["manifest_sha256"]  # the signed bytes, not a re-encoding
    trusted = Verifier(load_public_key(Path(key["public_key_path"])))
    assert InstalledReleases(store, trusted).verify("tiny", 1, "edge").version == 1


def test_a_release_signed_by_another_key_is_refused_and_the_old_one_keeps_serving(
        home: Home, tiny_release_b: Path) -> None:
    registry = start_registry(home.cli.home, home.root, TOKEN)
    edge = None
    try:
        # an empty store: the node becomes ready only once it has installed signed version 1
        edge = start("edge", home.root / "edge", home.root, "--registry", registry.target,
                     "--release-key", home.key()["public_key_path"], *SYNC_FLAGS,
                     registry_secret=TOKEN)
        assert served(edge) == 1
        received = node_metric(edge, "sync_bytes_received")
        other = home.cli("keygen", "--out", home.root / "other-key", "--json").json()
        # the registry refuses a key its TUF root does not name, before any work
        result = home.cli("--signing-key", other["private_key_path"], "publish",
                          tiny_release_b, "--name", "tiny", check=False)
        assert result.code == 2 and "is not a targets key" in result.stderr, result.stderr
        assert other["key_id"] in result.stderr
        assert [m["latest"] for m in home.cli("list", "--json").json()] == [1]
        # whoever holds the registry's database and that key lists a version anyway (version
        # 2, in a targets metadata signed by it): the node refuses it, fetching nothing
        assert list_behind_the_registry(home.cli, "tiny", 1, Path(other["private_key_path"])) == 2

        def refused() -> bool:
            row = status(home.cli).get(node_id(edge))
            return row is not None and row["state"] == "FAILED"

        wait_for(refused, 30, "the edge's FAILED (refused) ack")
        row = status(home.cli)[node_id(edge)]
        assert "refused:" in row["reason"] and \
            "not in the trusted TUF targets" in row["reason"], row["reason"]
        assert (row["version"], row["desired"]) == (1, 2)
        assert row["trust"]["error"] and "targets" in row["trust"]["error"]
        audited = [r for r in home.cli("audit", "--model", "tiny", "--json").json()
                   if r["action"] == "refused"]
        assert [(r["actor"], r["version"]) for r in audited] == [(f"node:{node_id(edge)}", 2)]
        home.cli("audit", "--verify")
        answer = httpx.post(f"{edge.url}/v2/models/tiny/infer", content=BODY, timeout=10)
        assert answer.status_code == 200 and answer.json()["model_version"] == "1"
        assert not (home.root / "edge" / "tiny" / "2").exists()
        assert node_metric(edge, "sync_bytes_received") == received  # nothing downloaded
    finally:
        if edge is not None:
            edge.stop()
        registry.stop()


def test_a_store_edited_without_re_signing_is_not_served_at_start_up(home: Home) -> None:
    # a second model, signed with the registry's key, that must keep serving
    catalog = home.cli.catalog()
    tiny = catalog.resolve("tiny", "1").manifest
    signer = keys.signer(RegistrySettings(home=home.cli.home, signing_key=None))
    catalog.create_version(msgspec.structs.replace(tiny, name="other"), signer=signer)
    store = home.root / "tampered"
    for model in ("tiny@1", "other@1"):
        home.cli("pull", model, "--tier", "edge", "--store", store)
    manifest = store / "tiny" / "1" / "release.json"
    data = json.loads(manifest.read_bytes())
    data["calibration"]["threshold"] = 0.0  # "never escalate", without re-signing
    manifest.write_text(json.dumps(data, indent=2))

    edge = start_tier("edge", store, home.root, "--poll-interval-s", "0.2", "--release-key",
                      home.key()["public_key_path"], env={"PATH": str(BIN)})
    try:
        ready = httpx.get(f"{edge.url}/v2/health/ready", timeout=5)
        assert ready.status_code == 200 and ready.json()["models"] == ["other"]
        tiny_ready = httpx.get(f"{edge.url}/v2/models/tiny/ready", timeout=5)
        assert tiny_ready.status_code == 503
        assert "does not verify" in tiny_ready.json()["error"]
        infer = httpx.post(f"{edge.url}/v2/models/tiny/infer", content=BODY, timeout=10)
        assert infer.status_code == 503
        other = httpx.post(f"{edge.url}/v2/models/other/infer", content=BODY, timeout=10)
        assert other.status_code == 200
        time.sleep(1.0)  # five store polls: the failure is logged once, not on every poll
        assert edge.log.read_text().count("cannot load tiny") == 1
    finally:
        edge.stop()


def test_releases_reaching_outside_their_folder_are_refused(
        registry_cli: RegistryCli, tiny_release: Path, tmp_path: Path) -> None:
    release = tmp_path / "release"
    shutil.copytree(tiny_release, release)
    spec = json.loads((release / "tiered.json").read_text())
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(release / "tokenizer.json", outside / "tokenizer.json")
    (release / "tok-link.json").symlink_to(outside / "tokenizer.json")
    (release / "linked-dir").symlink_to(outside)
    cases = {"center": "../release/center.pt", "edge": str(release / "edge.pt"),
             "tokenizer": "tok-link.json", "calibration": "linked-dir/tokenizer.json"}
    for field, value in cases.items():
        (release / "tiered.json").write_text(json.dumps({**spec, field: value}))
        result = registry_cli("publish", release, "--name", "tiny", check=False)
        assert result.code == 2, (field, result.stderr)
        assert "symlinks are not accepted" in result.stderr or \
            "plain relative paths" in result.stderr, (field, result.stderr)
    (release / "tiered.json").write_text(json.dumps(spec))
    for name in ("../evil", "ｔiny", ".hidden"):
        result = registry_cli("publish", release, "--name", name, check=False)
        assert result.code == 2 and "invalid model name" in result.stderr, result.stderr
    assert registry_cli("list", "--json").json() == []
    assert registry_cli("audit", "--json").json() == []
    assert not (registry_cli.home / "blobs").exists()
