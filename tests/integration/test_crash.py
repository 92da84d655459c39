"""SIGKILL ``registry publish`` inside each of its steps: the registry must stay consistent."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from registry.store import chain
from registry.store.blobs import BlobStore
from registry.store.db import connect, integrity_check
from serving.release.store import file_sha256
from tests.conftest import REGISTRY, RegistryCli

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KILLS = 10  # two kills inside each of the five steps
KILL_AFTER = ("validate", "export edge to ONNX", "quantize edge to INT8", "build probe",
              "calibrate threshold")  # publish's steps as it reports them on stderr


def check_consistent(home: Path) -> int:
    """integrity_check ok, audit chain intact, every visible version complete; returns count."""
    db = connect(home / "registry.sqlite3")
    # One read transaction: every query below sees the same snapshot, even while a running
    # ``registry serve`` appends acknowledgements between them.
    db.conn.execute("BEGIN")
    try:
        assert integrity_check(db) == "ok"
        checked, finding = chain.verify(db)
        assert finding is None, finding
        versions = list(db.query("SELECT model, version, manifest_sha256 FROM versions"))
        records = chain.records(db)
        published = {(r.model, r.version, r.sha256) for r in records if r.action == "publish"}
        assert {(v["model"], v["version"], v["manifest_sha256"]) for v in versions} == published
        blobs = BlobStore(home / "blobs")
        for artifact in db.query("SELECT * FROM artifacts"):
            path = blobs.path(artifact["sha256"])
            assert path.is_file() and file_sha256(path) == artifact["sha256"]
        numbers = sorted(v["version"] for v in versions)
        assert numbers == list(range(1, len(numbers) + 1))  # no holes, no half version
        assert checked == len(records)  # the chain covers every record (acks, rollouts too)
        return len(numbers)
    finally:
        db.conn.execute("ROLLBACK")
        db.conn.close()


def test_sigkill_during_publish_leaves_the_registry_consistent(
        registry_cli: RegistryCli, tiny_release: Path) -> None:
    """Each publish is killed the moment it reports a step done, so the kill lands inside the
    next one: export, quantize, probe, calibration, and the store-and-record transaction
    (whatever the machine's speed; a publish may still finish when that last step is quick)."""
    registry_cli("publish", tiny_release, "--name", "s")
    outcomes = {"killed": 0, "finished": 0}
    for i in range(KILLS):
        after = KILL_AFTER[i % len(KILL_AFTER)]
        proc = subprocess.Popen([str(REGISTRY), "publish", str(tiny_release), "--name", "s"],
                                env=registry_cli.env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        try:
            for line in proc.stderr:
                if line.strip() == f"✓ {after}":
                    proc.send_signal(signal.SIGKILL)
                    break
        finally:
            proc.stderr.close()
            proc.wait(timeout=120)
        assert proc.returncode in (0, -signal.SIGKILL), (after, proc.returncode)
        outcomes["killed" if proc.returncode else "finished"] += 1
        check_consistent(registry_cli.home)
    # the kills after validate, export and quantize land in a step that takes far longer than
    # delivering a signal: at least those 6 of the 10 publishes are killed
    assert outcomes["killed"] >= KILLS * 3 // len(KILL_AFTER), outcomes
    before = check_consistent(registry_cli.home)
    after_kills = registry_cli("publish", tiny_release, "--name", "s", "--json").json()
    assert after_kills["manifest"]["version"] == before + 1
    assert check_consistent(registry_cli.home) == before + 1


def test_concurrent_publishers_get_consecutive_versions(
        registry_cli: RegistryCli, tiny_release: Path) -> None:
    registry_cli("init")  # the home, made on purpose: publish refuses a folder that is none
    procs = [subprocess.Popen([str(REGISTRY), "publish", str(tiny_release), "--name", "s",
                               "--json"], env=registry_cli.env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outcomes = [(p.returncode, out, err) for p in procs
                for out, err in [p.communicate(timeout=300)]]
    assert [code for code, _, _ in outcomes] == [0, 0, 0], [err[-2000:] for *_, err in outcomes]
    versions = sorted(json.loads(out)["manifest"]["version"] for _, out, _ in outcomes)
    assert versions == [1, 2, 3]
    assert check_consistent(registry_cli.home) == 3
