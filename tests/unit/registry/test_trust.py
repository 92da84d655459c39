"""Release metadata on The Update Framework, both sides with real python-tuf metadata: what
``registry publish``/``sign``/``key rotate``/``serve`` write (``registry.trust.tuf``) and what a
node accepts from it (``serving.release.trust``): root rotation, revoked keys, thresholds, freeze,
rollback and mix-and-match."""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry.releases.catalog import Catalog
from registry.store.db import connect, transaction
from registry.trust import tuf
from registry.trust.keys import Signer
from serving.errors import SigningError
from serving.release.manifest import Manifest, decode
from serving.release.signing import Verifier
from serving.release.trust import NodeTrust, TrustRefused
from sync.wire import directive
from tests.conftest import RegistryCli
from tests.unit.registry.test_rollout import manifest


def new_key() -> Signer:
    return Signer(Ed25519PrivateKey.generate())


class Fleet:
    """A registry database and its signing key; ``push`` is what ``registry serve`` sends."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.key = new_key()
        self.catalog = Catalog(connect(root / "registry.sqlite3"), "tester")
        self.db = self.catalog.db

    def publish(self, name: str = "m", seed: int = 0, signer: Signer | None = None) -> int:
        return self.catalog.create_version(manifest(name, seed), signer=signer or self.key)

    def advance(self, online: Signer | None = None, expiry_s: float = 60,
                at: datetime | None = None) -> None:
        tuf.advance(self.db, online or self.key, expiry_s, at)

    def push(self) -> tuf.Published:
        published = tuf.published(self.db)
        assert published is not None
        return published

    def release(self, name: str, version: int) -> tuple[Manifest, bytes]:
        row = self.catalog.resolve(name, str(version))
        return decode(row.manifest_bytes), row.manifest_bytes

    def node(self, name: str = "edge") -> NodeTrust:
        return NodeTrust(self.root / name, Verifier(self.key.key.public_key()))


def send(node: NodeTrust, published: tuf.Published) -> None:
    node.update(published.roots_after(node.state().root_version), published.timestamp,
                published.snapshot, published.targets)


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path)


def test_a_registry_from_before_tuf_moves_over_and_a_pinned_node_follows(fleet: Fleet) -> None:
    fleet.publish()  # no root yet: signed the old way only
    foreign = fleet.catalog.create_version(manifest(seed=1), signer=new_key())
    assert tuf.ensure(fleet.db, fleet.key, fleet.key.key.public_key())
    assert not tuf.ensure(fleet.db, fleet.key, fleet.key.key.public_key())  # once
    fleet.advance()
    published = fleet.push()
    assert published.trusted == {("m", 1)}  # the other key's version is not vouched for
    node = fleet.node()
    send(node, published)
    assert node.state().root_version == 1 and not node.state().stale
    node.check_release(*fleet.release("m", 1))
    with pytest.raises(SigningError, match="not in the trusted TUF targets"):
        node.check_release(*fleet.release("m", foreign))
    # a restart: what verified is on disk, and the store's check uses it
    again = fleet.node()
    assert again.state().root_version == 1
    again.check(fleet.release("m", 1)[1], None)
    with pytest.raises(SigningError, match="not in this node's trusted TUF targets"):
        again.check(fleet.release("m", foreign)[1], None)


def test_a_root_not_signed_by_the_pinned_key_is_not_trusted(fleet: Fleet, tmp_path: Path) -> None:
    fleet.publish()
    tuf.ensure(fleet.db, fleet.key, fleet.key.key.public_key())
    fleet.advance()
    stranger = NodeTrust(tmp_path / "stranger", Verifier(new_key().key.public_key()))
    with pytest.raises(TrustRefused, match="not signed by the provisioned key"):
        send(stranger, fleet.push())
    assert not stranger.established


def test_nodes_follow_root_rotations_and_refuse_what_a_revoked_key_signs(fleet: Fleet) -> None:
    tuf.ensure(fleet.db, fleet.key, fleet.key.key.public_key())
    fleet.publish()
    fleet.advance()
    early = fleet.node("early")
    send(early, fleet.push())
    root, publisher = new_key(), new_key()
    with transaction(fleet.db) as conn:
        tuf.rotate(conn, "root", [root.key.public_key()], 1, [fleet.key, root])
        done = tuf.rotate(conn, "targets", [publisher.key.public_key()], 1, [root],
                            [publisher])
    assert done["revoked"] == [tuf.short(tuf.tuf_key(fleet.key.key.public_key()))]
    fleet.advance()
    send(early, fleet.push())
    assert early.state().root_version == 3
    early.check_release(*fleet.release("m", 1))  # re-signed by the new publisher key
    late = fleet.node("late")  # provisioned with the old key: walks 1 -> 3 alone
    send(late, fleet.push())
    assert late.state().root_version == 3
    # the old publisher key can no longer publish through the registry ...
    with pytest.raises(tuf.TrustError, match="is not a targets key of root version 3"):
        fleet.publish(seed=2)
    assert fleet.db.execute("SELECT MAX(version) FROM versions").fetchone()[0] == 1
    # ... and a registry that lists a release signed with it anyway is refused by the node
    version = fleet.publish(seed=2, signer=publisher)
    fleet.advance()
    send(early, fleet.push())
    with transaction(fleet.db) as conn:
        stolen = tuf.latest(conn, tuf.TARGETS)
        assert stolen is not None
        md = stolen.md
        md.signed.version += 1
        md.signed.targets.update(tuf.release_files(manifest(seed=3), b"{}"))
        md.sign(tuf.CryptoSigner(fleet.key.key))  # the revoked key
        tuf._put(conn, tuf.TARGETS, md, True)
    fleet.advance()
    with pytest.raises(TrustRefused, match="targets"):
        send(early, fleet.push())
    early.check_release(*fleet.release("m", version))  # what verified before still counts
    with pytest.raises(SigningError):
        early.check(b"{}", None)


def test_a_root_without_enough_old_signatures_is_not_made(fleet: Fleet) -> None:
    tuf.ensure(fleet.db, fleet.key, fleet.key.key.public_key())
    with transaction(fleet.db) as conn, pytest.raises(tuf.TrustError, match="old root"):
        tuf.rotate(conn, "root", [new_key().key.public_key()], 1, [new_key()])
    with transaction(fleet.db) as conn, pytest.raises(tuf.TrustError, match="new root"):
        tuf.rotate(conn, "root", [new_key().key.public_key()], 1, [fleet.key])
    with transaction(fleet.db) as conn:
        assert tuf.root_of(conn).version == 1


def test_a_release_below_its_signature_threshold_waits_and_never_installs(fleet: Fleet) -> None:
    tuf.ensure(fleet.db, fleet.key, fleet.key.key.public_key())
    second = new_key()
    with transaction(fleet.db) as conn:
        tuf.rotate(conn, "targets", [fleet.key.key.public_key(), second.key.public_key()], 2,
                     [fleet.key], [fleet.key, second])
    fleet.advance()
    node = fleet.node()
    send(node, fleet.push())
    version = fleet.publish()
    fleet.advance()
    published = fleet.push()
    assert published.waiting == {("m", version)} and ("m", version) not in published.trusted
    send(node, published)
    with pytest.raises(SigningError, match="not in the trusted TUF targets"):
        node.check_release(*fleet.release("m", version))
    with transaction(fleet.db) as conn:
        assert tuf.pending(conn) == {"version": 3, "signed": 1, "threshold": 2,
                                       "releases": ["m@1"]}
    signed, verdict = fleet.catalog.sign("m", second, version)
    assert signed == [] and verdict is not None and verdict.complete
    fleet.advance()
    send(node, fleet.push())
    node.check_release(*fleet.release("m", version))


def test_a_frozen_registry_is_flagged_stale_and_installs_nothing(fleet: Fleet) -> None:
    tuf.ensure(fleet.db, fleet.key, fleet.key.key.public_key())
    fleet.publish()
    fleet.advance(expiry_s=3, at=datetime.now(UTC) - timedelta(seconds=1))  # ~2 s left
    node = fleet.node()
    frozen = fleet.push()
    send(node, frozen)
    state = node.state()
    assert not state.stale and state.as_dict()["stale_since"] is None
    node.check_release(*fleet.release("m", 1))
    time.sleep(max(0.0, state.expires - time.time()) + 0.2)
    stale = node.state()
    assert stale.stale and stale.as_dict()["stale_since"] == \
        datetime.fromtimestamp(state.expires, UTC).isoformat()
    # expired while the stream was quiet, no refresh tried (let alone failed): installs nothing
    assert not stale.error
    with pytest.raises(SigningError, match="stale"):
        node.check_release(*fleet.release("m", 1))
    with pytest.raises(TrustRefused, match="xpired"):  # the frozen registry replays it
        send(node, frozen)
    assert node.state().stale
    with pytest.raises(SigningError, match="stale"):
        node.check_release(*fleet.release("m", 1))
    fleet.advance(expiry_s=60)  # the registry signs again: fresh
    send(node, fleet.push())
    assert not node.state().stale
    node.check_release(*fleet.release("m", 1))


def test_only_roots_online_key_advances_the_timestamp(fleet: Fleet) -> None:
    tuf.ensure(fleet.db, fleet.key, fleet.key.key.public_key())
    fleet.advance()
    with pytest.raises(tuf.Frozen, match="not a timestamp key"):
        fleet.advance(online=new_key())


def test_expired_and_rolled_back_timestamps_are_refused(fleet: Fleet) -> None:
    tuf.ensure(fleet.db, fleet.key, fleet.key.key.public_key())
    fleet.publish()
    start = datetime.now(UTC)
    fleet.advance(expiry_s=3, at=start - timedelta(seconds=10))  # signed, then expired
    expired = fleet.push()
    node = fleet.node()
    with pytest.raises(TrustRefused, match="xpired"):
        send(node, expired)
    fleet.advance(expiry_s=60)
    fresh = fleet.push()
    send(node, fresh)
    assert not node.state().stale
    fleet.advance(expiry_s=60, at=datetime.now(UTC) + timedelta(seconds=50))  # v3
    send(node, fleet.push())
    assert node.state().timestamp_version == fresh.timestamp_version + 1
    with pytest.raises(TrustRefused):  # the older one again: a rollback
        send(node, fresh)
    assert node.state().timestamp_version == fresh.timestamp_version + 1


def test_a_current_targets_with_an_older_snapshot_is_refused(fleet: Fleet) -> None:
    tuf.ensure(fleet.db, fleet.key, fleet.key.key.public_key())
    fleet.publish()
    fleet.advance()
    old = fleet.push()
    node = fleet.node()
    send(node, old)
    fleet.publish(seed=1)
    fleet.advance()
    new = fleet.push()
    with pytest.raises(TrustRefused):  # new timestamp, old snapshot
        node.update([], new.timestamp, old.snapshot, new.targets)
    with pytest.raises(TrustRefused):  # old timestamp and snapshot, new targets
        node.update([], old.timestamp, old.snapshot, new.targets)
    with pytest.raises(SigningError, match="not in the trusted TUF targets"):
        node.check_release(*fleet.release("m", 2))
    send(node, new)
    node.check_release(*fleet.release("m", 2))


def test_directives_are_checked_with_roots_online_keys(fleet: Fleet) -> None:
    tuf.ensure(fleet.db, fleet.key, fleet.key.key.public_key())
    fleet.advance()
    node = fleet.node()
    order = directive.Directive("edge-1", "m", 1, hashlib.sha256(b"x").hexdigest(), 3,
                                "0" * 64)
    data, signature = directive.sign(fleet.key, order)
    node.check_directive(data, signature)  # before any push: the pinned key
    send(node, fleet.push())
    node.check_directive(data, signature)
    online = new_key()
    with transaction(fleet.db) as conn:
        tuf.rotate(conn, "online", [online.key.public_key()], 1, [fleet.key])
    fleet.advance(online=online)
    send(node, fleet.push())
    with pytest.raises(SigningError, match="not signed by a timestamp key"):
        node.check_directive(data, signature)
    node.check_directive(*directive.sign(online, order))


def test_a_rotation_that_waits_for_a_second_publisher_is_completed_by_registry_sign(
        fleet: Fleet) -> None:
    tuf.ensure(fleet.db, fleet.key, fleet.key.key.public_key())
    fleet.publish()
    second = new_key()
    with transaction(fleet.db) as conn:
        done = tuf.rotate(conn, "targets", [fleet.key.key.public_key(),
                                              second.key.public_key()], 2, [fleet.key],
                            [fleet.key])
    assert done["targets"] == {"version": 3, "complete": False, "missing": 1}
    with transaction(fleet.db) as conn:
        assert tuf.pending(conn) == {"version": 3, "signed": 1, "threshold": 2,
                                       "releases": []}
    signed, verdict = fleet.catalog.sign("m", second)
    assert signed == [] and verdict is not None and verdict.complete
    fleet.advance()
    node = fleet.node()
    send(node, fleet.push())
    assert node.state().root_version == 2
    node.check_release(*fleet.release("m", 1))


def test_key_rotate_refuses_bad_input_and_records_nothing(registry_cli: RegistryCli,
                                                          tmp_path: Path) -> None:
    registry_cli("key")  # the key, and root version 1 made with it
    other = registry_cli("keygen", "--out", tmp_path / "other", "--json").json()
    public, private = other["public_key_path"], other["private_key_path"]
    cases = [
        (("--role", "targets", "--key", tmp_path / "nope"), "neither an Ed25519"),
        (("--role", "root", "--key", public), "needs 1 signature(s) of the new root keys"),
        (("--role", "root", "--key", private, "--key", public, "--threshold", "3"),
         "threshold 3 needs 1 to 2"),
        (("--role", "online", "--key", public, "--root-key", public), "takes private keys"),
        (("--role", "online", "--key", public, "--root-key", private),
         "signature(s) of the old root keys"),
    ]
    for args, said in cases:
        result = registry_cli("key", "rotate", *args, check=False)
        assert result.code == 2 and said in result.stderr, (args, result.stderr)
    assert registry_cli("key", "--json").json()["tuf"]["root_version"] == 1
    assert "rotate-key" not in [r["action"] for r in registry_cli("audit", "--json").json()]
    done = registry_cli("key", "rotate", "--role", "online", "--key", public, "--json").json()
    assert done["root_version"] == 2 and done["keys"] == [other["key_id"]]
    tuf = registry_cli("key", "--json").json()["tuf"]
    assert tuf["roles"]["timestamp"]["keys"] == [other["key_id"]]
    assert [r["action"] for r in registry_cli("audit", "--json").json()] == ["rotate-key"]
