"""The ``registry`` command."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import msgspec
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from registry.cli import tables
from registry.errors import AuditChainBroken, NotPrimary, RegistryError
from registry.fleet import budgets
from registry.fleet.nodes import NodeBook
from registry.ha import changes
from registry.publish.pull import pull
from registry.releases import waves
from registry.releases.catalog import Catalog
from registry.releases.names import check_name
from registry.settings import RegistrySettings
from registry.store import chain, role
from registry.store.blobs import BlobStore
from registry.store.db import connect, read
from registry.trust import anchor, keys, tuf
from registry.trust.anchor import audited
from serving.config.flags import options as settings_options
from serving.config.tokens import NODE_ID, TokenError, node_token, parse, write_secret
from serving.release.store import ModelStore, StoreError

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


class Context:
    def __init__(self, settings: RegistrySettings) -> None:
        self.settings = settings
        self._catalog: Catalog | None = None
        self.opened_at = 0

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog(connect(self.settings.database), self.settings.actor,
                                    anchor.for_settings(self.settings))
            self.opened_at = changes.position(self._catalog.db.conn)
            BlobStore(self.settings.blobs).sweep_temporaries()
        return self._catalog

    def replicated(self) -> None:
        """After a command that changed replicated data on the primary of a group: wait until
        ``sync_standbys`` standbys hold it (semi-synchronous), or say that it stands on the
        primary alone."""
        if self._catalog is None:
            return
        conn = self._catalog.db.conn
        at = changes.position(conn)
        wanted = self.settings.sync_standbys
        if at <= self.opened_at or wanted == 0 or role.state(conn).role != "primary":
            return
        holders = changes.wait_replicated(self._catalog.db, at, wanted,
                                              self.settings.sync_timeout_s)
        if holders is None and not role.state(conn).writable:
            raise NotPrimary(
                f"committed here, but this registry is no longer the primary (its lease ran "
                f"out: `registry serve` died or lost the Consul lock) and no standby confirmed "
                f"the change within {self.settings.sync_timeout_s:g}s: it may be lost (if "
                f"another registry took over, this copy is put aside when this one rejoins); "
                f"check `registry replication` on the primary and run the command again there")
        if holders is None:
            err.print(f"[yellow]warning:[/] committed on the primary, but fewer than {wanted} "
                      f"standby(s) hold it (none following, or none within "
                      f"{self.settings.sync_timeout_s:g}s): it is replicated asynchronously and "
                      f"would be lost if this host died now "
                      f"(registry_replication_async_commits_total)")


pass_ctx = click.make_pass_decorator(Context)
WAVE_FLAGS = ("wave_pace", "wave_growth", "wave_bake_s", "wave_install_timeout_s",
              "wave_max_failures", "wave_max_agreement_drop", "wave_min_audit_rows",
              "wave_min_audit_nodes", "wave_max_drift_share", "wave_max_p99_ratio")


def wave_policy(settings: RegistrySettings, shares: str, given: dict[str, Any]) -> waves.WavePolicy:
    """A rollout's policy: ``shares`` (``1%,10%,100%``), each gate setting from its flag when
    given, else from the settings."""
    values = {key: given.get(key, getattr(settings, key)) for key in WAVE_FLAGS}
    return waves.WavePolicy(waves.parse_waves(shares), **{
        key.removeprefix("wave_"): value for key, value in values.items()}).check()
json_flag = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")


def emit(as_json: bool, data: Any, human: Callable[[], None]) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        human()


def split_ref(ref: str) -> tuple[str, str | None]:
    name, _, version = ref.partition("@")
    return name, version or None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@settings_options(RegistrySettings, ("home", "actor", "signing_key"))
@click.pass_context
def cli(ctx: click.Context, home: Path | None, actor: str | None,
        signing_key: Path | None) -> None:
    """Tiered model registry: versioned releases, blob store, hash-chained audit log."""
    flags: dict[str, Any] = {"home": home, "actor": actor, "signing_key": signing_key}
    overrides = {key: value for key, value in flags.items() if value is not None}
    try:
        ctx.obj = Context(RegistrySettings(**overrides))
    except ValidationError as exc:
        raise click.UsageError(f"invalid settings: {exc}") from exc


@cli.result_callback()
@pass_ctx
def _after(ctx: Context, *_: Any, **__: Any) -> None:
    ctx.replicated()


@cli.command("publish")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--name", required=True, help="Model name: [a-z0-9][a-z0-9._-]*.")
@click.option("--canary", default="", help="Comma-separated node ids: roll out to these only "
              "(alias 'canary') until `registry promote`.")
@click.option("--waves", default=None, metavar="SHARES", help="Roll out to the edges in waves, "
              "e.g. 1%,10%,50%,100%, with a gate after each (`registry rollout`).")
@settings_options(RegistrySettings, WAVE_FLAGS)
@settings_options(RegistrySettings, ("min_fidelity", "tolerance", "confidence"))
@click.option("--force", is_flag=True, help="Publish even when fidelity is below the floor.")
@click.option("--skip-existing", is_flag=True,
              help="Do nothing if the latest version was built from identical source files.")
@click.option("--tokenizer", type=click.Path(path_type=Path), default=None,
              help="Single TorchScript file only: tokenizer.json to ship with it.")
@click.option("--labels", default=None, help="Single TorchScript file only: comma-separated "
              "label names (default: output indices).")
@click.option("--calibration", type=click.Path(path_type=Path), default=None,
              help="Single TorchScript file only: labelled JSON Lines split to calibrate on.")
@click.option("--max-length", type=click.IntRange(1, 4096), default=128, show_default=True,
              help="Single TorchScript file only: tokens kept per input.")
@json_flag
@pass_ctx
def publish_cmd(ctx: Context, path: Path, name: str, canary: str, waves: str | None,
                min_fidelity: float | None, tolerance: float | None, confidence: float | None,
                force: bool, skip_existing: bool, tokenizer: Path | None, labels: str | None,
                calibration: Path | None, max_length: int, as_json: bool,
                **wave_flags: Any) -> None:
    """Build a release from PATH and record it as the next version of NAME.

    PATH is a release folder with a tiered.json (center TorchScript, edge TorchScript or fp32
    ONNX, tokenizer, labels, labelled calibration split) or a single TorchScript file, which
    is then both the center and, quantized to INT8, the edge.
    """
    from registry.publish.source import load_source

    check_name(name)
    settings = ctx.settings
    given = {key: value for key, value in wave_flags.items() if value is not None}
    if given and waves is None:
        raise click.UsageError(f"--{next(iter(given)).replace('_', '-')} applies to --waves only")
    if waves is not None and canary:
        raise click.UsageError("--canary and --waves exclude each other")
    rollout = None if waves is None else wave_policy(settings, waves, given)
    source = load_source(path, tokenizer=tokenizer,
                         labels=labels.split(",") if labels else None,
                         calibration=calibration, max_length=max_length)
    # torch and onnxruntime load here only: list/show/audit, and a refused PATH, stay fast
    from registry.publish.pipeline import PublishOptions, publish

    options = PublishOptions(
        name=name, force=force, skip_existing=skip_existing,
        min_fidelity=settings.min_fidelity if min_fidelity is None else min_fidelity,
        tolerance=settings.tolerance if tolerance is None else tolerance,
        confidence=settings.confidence if confidence is None else confidence,
        canary=[n for n in canary.split(",") if n], rollout=rollout)
    result = publish(settings, ctx.catalog, source, options, step=_step)
    emit(as_json, {"created": result.created, "manifest": msgspec.to_builtins(result.manifest),
                   "edge_fp32_size": result.edge_fp32_size, "seconds": result.seconds},
         lambda: tables.publish_summary(out, result))


@contextmanager
def _step(name: str) -> Iterator[None]:
    with err.status(f"{name} …"):
        yield
    err.print(f"[green]✓[/] {name}")


@cli.command("list")
@json_flag
@pass_ctx
def list_cmd(ctx: Context, as_json: bool) -> None:
    """List models with their latest, production and canary versions."""
    models = ctx.catalog.models()
    emit(as_json, models, lambda: tables.models_table(out, models))


@cli.command("show")
@click.argument("ref")
@json_flag
@pass_ctx
def show_cmd(ctx: Context, ref: str, as_json: bool) -> None:
    """Show NAME (all versions) or NAME@VERSION / NAME@ALIAS (its manifest)."""
    name, version = split_ref(ref)
    if version is None:
        rows = ctx.catalog.versions(name)
        emit(as_json, [tables.version_dict(r) for r in rows],
             lambda: tables.versions_table(out, name, rows))
    else:
        row = ctx.catalog.resolve(name, version)
        emit(as_json, tables.version_dict(row, full=True), lambda: tables.version_detail(out, row))


@cli.command("pull")
@click.argument("ref")
@click.option("--tier", type=click.Choice(["edge", "center"]), required=True,
              help="Which artifact to materialize: INT8 ONNX (edge) or TorchScript (center).")
@click.option("--store", type=click.Path(path_type=Path), required=True,
              help="Model store folder, e.g. ./var/edge.")
@click.option("--no-activate", is_flag=True, help="Install without pointing CURRENT at it.")
@json_flag
@pass_ctx
def pull_cmd(ctx: Context, ref: str, tier: str, store: Path, no_activate: bool,
             as_json: bool) -> None:
    """Materialize NAME[@VERSION] (default: production) into a tier's model store."""
    name, version = split_ref(ref)
    row = ctx.catalog.resolve(name, version)
    folder = pull(BlobStore(ctx.settings.blobs), row.manifest, "edge" if tier == "edge"
                  else "center", ModelStore(store), activate=not no_activate,
                  raw=row.manifest_bytes or None, signature=row.signature)
    emit(as_json, {"model": name, "version": row.version, "tier": tier, "path": str(folder)},
         lambda: out.print(f"{name} version {row.version} ({tier}) -> {folder}"))


@cli.group("key", invoke_without_command=True)
@click.option("--path", "path_only", is_flag=True,
              help="Print only the public key file's path (for --release-key).")
@click.option("--root", "root_out", type=click.Path(path_type=Path), default=None,
              help="Also write the current TUF root metadata to this file: a node given it as "
                   "--release-key trusts it (and the roots after it) instead of the key.")
@json_flag
@click.pass_context
def key_cmd(click_ctx: click.Context, path_only: bool, root_out: Path | None,
            as_json: bool) -> None:
    """Print the public key releases are signed with (PEM on stdout, its id and file on
    stderr); creates the default key pair on first use. Give the file to edges and centers
    as --release-key. `registry key rotate` changes the keys of a TUF role."""
    if click_ctx.invoked_subcommand is not None:
        return
    ctx: Context = click_ctx.obj
    public = keys.public_key(ctx.settings)
    catalog = ctx.catalog
    with contextlib.suppress(NotPrimary):  # a standby shows what it replicated
        tuf.ensure(catalog.db, keys.signer(ctx.settings),
                     keys.online_signer(ctx.settings).key.public_key())
    metadata = tuf.describe(catalog.db)
    data: dict[str, Any] = {"key_id": public.key_id, "public_key": public.pem,
                            "public_key_path": str(public.public_path),
                            "private_key_path": str(public.private_path), "tuf": metadata}
    if root_out is not None:
        with read(catalog.db) as conn:
            root = tuf.latest(conn, tuf.ROOT)
        if root is None:
            raise RegistryError("this registry has no TUF root yet (a standby before its "
                                "primary made one)")
        root_out.write_bytes(root.data)
        data["root_path"] = str(root_out)
    if path_only and not as_json:
        click.echo(str(public.public_path))
        return

    def human() -> None:
        click.echo(public.pem, nl=False)
        err.print(f"key id {public.key_id}; public key {public.public_path} (give it to edges "
                  f"and centers as --release-key)")
        if metadata is not None:
            tables.trust_view(err, metadata)

    emit(as_json, data, human)


def _key_file(path: Path) -> tuple[Any, keys.Signer | None]:
    """A key file for ``rotate``: a private key (it also signs) or a public key."""
    from serving.release.signing import SigningError, load_public_key

    try:
        signer = keys.Signer(keys.load_private_key(path))
        return signer.key.public_key(), signer
    except SigningError:
        pass
    try:
        return load_public_key(path), None
    except SigningError as exc:
        raise click.UsageError(f"{path}: neither an Ed25519 private nor public key "
                               f"({exc})") from None


@key_cmd.command("rotate")
@click.option("--role", type=click.Choice(["root", "targets", "online"]), required=True,
              help="root: the offline root keys; targets: the publisher keys (`registry "
                   "publish` / `registry sign`); online: the key `registry serve` signs "
                   "snapshot, timestamp and directives with (REGISTRY_ONLINE_KEY).")
@click.option("--key", "key_files", type=click.Path(path_type=Path), multiple=True,
              required=True, help="A key of the role from now on (repeat for several). A "
                                  "private key also signs: the new root (--role root) or the "
                                  "current targets (--role targets).")
@click.option("--threshold", type=click.IntRange(1, 32), default=1, show_default=True,
              help="Signatures of these keys needed (k of n).")
@click.option("--root-key", "root_files", type=click.Path(path_type=Path), multiple=True,
              help="A private key of the current root (repeat up to its threshold); "
                   "default: the signing key.")
@json_flag
@pass_ctx
def key_rotate_cmd(ctx: Context, role: str, key_files: tuple[Path, ...], threshold: int,
                   root_files: tuple[Path, ...], as_json: bool) -> None:
    """Make TUF root version N+1 with new keys for ROLE, signed by the current root keys and
    (for --role root) the new ones. Nodes follow it over the sync stream without a restart;
    what only the old keys signed is refused from then on. Audited."""
    loaded = [_key_file(path) for path in key_files]
    signers = [s for _, s in loaded if s is not None]
    root_signers = [_key_file(path)[1] for path in root_files]
    if any(s is None for s in root_signers):
        raise click.UsageError("--root-key takes private keys (they sign the new root)")
    old_root = [s for s in root_signers if s is not None] or [keys.signer(ctx.settings)]
    catalog = ctx.catalog
    tuf.ensure(catalog.db, keys.signer(ctx.settings),
                 keys.online_signer(ctx.settings).key.public_key())
    with audited(catalog.db, catalog.anchor) as conn:
        done = tuf.rotate(conn, role, [public for public, _ in loaded], threshold,
                            [*old_root, *(signers if role == "root" else [])],
                            signers if role == "targets" else [])
        chain.append(conn, actor=ctx.settings.actor, action="rotate-key", payload=done)

    def human() -> None:
        out.print(f"root version {done['root_version']}: {role} keys {', '.join(done['keys'])} "
                  f"(threshold {threshold}); revoked {', '.join(done['revoked']) or 'none'}")
        targets = done.get("targets")
        if targets is not None and not targets["complete"]:
            out.print(f"[yellow]targets version {targets['version']} awaits "
                      f"{targets['missing']} more signature(s) of the new keys: `registry "
                      f"sign` with each (nodes install nothing new until then)[/]")
        if role == "online":
            out.print("`registry serve` signs with REGISTRY_ONLINE_KEY: point it at the new "
                      "key (the file is read again at each re-signing)")

    emit(as_json, done, human)


@cli.command("keygen")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Folder for signing.key (mode 0600) and signing.pub. [default <home>/keys]")
@json_flag
@pass_ctx
def keygen_cmd(ctx: Context, out: Path | None, as_json: bool) -> None:
    """Generate a new Ed25519 signing key pair (never overwrites an existing key)."""
    public = keys.keygen(out or ctx.settings.home / "keys")
    data = {"key_id": public.key_id, "public_key_path": str(public.public_path),
            "private_key_path": str(public.private_path)}
    emit(as_json, data, lambda: _print_key(public))


def _print_key(public: keys.PublicKey) -> None:
    out.print(f"key id {public.key_id}\nprivate key {public.private_path} (keep it secret; "
              f"REGISTRY_SIGNING_KEY)\npublic key  {public.public_path} (--release-key of edges "
              f"and centers)")


@cli.command("sign")
@click.argument("ref")
@json_flag
@pass_ctx
def sign_cmd(ctx: Context, ref: str, as_json: bool) -> None:
    """Sign NAME@VERSION, or NAME, with the signing key (--signing-key): a version published
    before signing existed is signed and listed in the TUF targets; a release waiting for
    more publisher signatures (a targets threshold above 1) gets this key's. Audited; a
    signed version is never re-signed."""
    name, version = split_ref(ref)
    if version is not None and not version.isdigit():
        raise click.UsageError("sign takes NAME or NAME@VERSION (a number)")
    signer = keys.signer(ctx.settings)
    tuf.ensure(ctx.catalog.db, signer, keys.online_signer(ctx.settings).key.public_key())
    signed, verdict = ctx.catalog.sign(name, signer, int(version) if version else None)
    data: dict[str, Any] = {"model": name, "signed": signed, "key_id": signer.key_id,
                            "targets": None if verdict is None else {
                                "version": verdict.version, "complete": verdict.complete,
                                "signed": verdict.signed, "threshold": verdict.threshold}}

    def human() -> None:
        out.print(f"{name}: signed versions {signed or 'none (all were signed)'} with key "
                  f"{signer.key_id}")
        if verdict is not None:
            out.print(f"targets version {verdict.version}: {verdict.signed} of "
                      f"{verdict.threshold} signatures" + (" - complete: it goes out now"
                                                           if verdict.complete else ""))

    emit(as_json, data, human)


@cli.command("promote")
@click.argument("name")
@click.option("--version", type=click.IntRange(min=1), default=None,
              help="Version to make production (default: the canary).")
@json_flag
@pass_ctx
def promote_cmd(ctx: Context, name: str, version: int | None, as_json: bool) -> None:
    """Point the production alias at the canary (or VERSION) and roll it out to all nodes."""
    target = ctx.catalog.promote(name, version)
    emit(as_json, {"model": name, "production": target},
         lambda: out.print(f"{name}: production -> version {target}"))


@cli.command("rollback")
@click.argument("name")
@click.option("--to", "to", type=click.IntRange(min=1), default=None,
              help="Version to go back to (default: the one before production).")
@json_flag
@pass_ctx
def rollback_cmd(ctx: Context, name: str, to: int | None, as_json: bool) -> None:
    """Point the production alias back to an earlier version."""
    previous, target = ctx.catalog.rollback(name, to)
    emit(as_json, {"model": name, "from": previous, "production": target},
         lambda: out.print(f"{name}: production version {previous} -> {target}"))


@cli.command("audit")
@click.option("--verify", is_flag=True, help="Walk the hash chain and compare it with the "
              "signed head beside the database; exit 1 at the first problem.")
@click.option("--anchor", "anchor_head", is_flag=True, help="Sign the current head of a chain "
              "that has none yet (a registry from before signed heads); refused when one "
              "exists.")
@click.option("--model", default=None, help="Only records about this model.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the last N.")
@json_flag
@pass_ctx
def audit_cmd(ctx: Context, verify: bool, anchor_head: bool, model: str | None,
              limit: int | None, as_json: bool) -> None:
    """Show the audit log, verify its hash chain and signed head, or anchor its head."""
    db = ctx.catalog.db
    if verify or anchor_head:
        checked, finding = chain.verify(db)
        settings = ctx.settings
        head, problem = anchor.check(db, settings.home / anchor.FILE,
                                     keys.verifying_key(settings),
                                     keys.public_path(settings.signing_key_path))
        if anchor_head and finding is None and head is None and problem is not None:
            # the only problem is the missing head: sign the chain as it is now (an AnchorError
            # is a RegistryError: main() prints it and exits 1)
            head = anchor.for_settings(settings).create(db)
            problem = None
        elif anchor_head and problem is None and finding is None:
            raise RegistryError(f"{settings.home / anchor.FILE} exists or the log is empty: "
                                f"nothing to anchor")
        seen, rewound = anchor.witnessed(db)  # the highest seq the nodes reported
        data = {"ok": finding is None and problem is None and rewound is None,
                "checked": checked, "first_bad": None if finding is None else finding.__dict__,
                "head": None if head is None else head.to_json(), "head_problem": problem,
                "nodes_seen_seq": seen, "nodes_problem": rewound}
        emit(as_json, data, lambda: tables.audit_verdict(out, checked, finding, head, problem,
                                                         seen, rewound))
        if finding is not None or problem is not None or rewound is not None:
            raise SystemExit(AuditChainBroken.exit_code)
        return
    rows = chain.records(db, model=model, limit=limit)
    emit(as_json, [r.__dict__ for r in rows], lambda: tables.audit_table(out, rows))


@cli.command("status")
@json_flag
@pass_ctx
def status_cmd(ctx: Context, as_json: bool) -> None:
    """Per model, every node that subscribed: version, desired version, ack state, last seen,
    escalation rate and p99 from its last quality report; nodes that lag are named."""
    rows = NodeBook(ctx.catalog.db).status(ctx.catalog)

    def human() -> None:
        tables.status_tables(out, rows)
        stale = sorted({r["node"] for r in rows if (r.get("trust") or {}).get("stale")})
        if stale:
            out.print(f"[red]release metadata stale on {len(stale)} node(s)[/] "
                      f"({', '.join(stale[:10])}): no fresh TUF timestamp reached them")
        for model in ctx.catalog.models():
            rollout = rollout_state(ctx, model["name"])
            if rollout is not None and (rollout["state"] in waves.OPEN or
                                        model["production"] != rollout["version"]):
                tables.rollout_view(out, rollout)

    emit(as_json, rows, human)


def rollout_state(ctx: Context, name: str) -> dict[str, Any] | None:
    """The model's newest wave rollout (``Rollout.to_json``) with its current wave's nodes."""
    conn = ctx.catalog.db.conn
    r = waves.latest(conn, name)
    if r is None:
        return None
    fleet = waves.edges(conn, name)
    inside = [s for pos, s in fleet if pos < r.cutoff]
    return r.to_json() | {"nodes": {
        "edges": len(fleet), "wave": len(inside),
        "installed": sum(s.installed(r.version) for s in inside),
        "failed": sum(s.failed(r.version) for s in inside),
        "connected": sum(s.connected for s in inside)}}


@cli.group("rollout")
def rollout_group() -> None:
    """Wave rollouts (`registry publish --waves`): where one is, pause, resume or abort it."""


@rollout_group.command("show")
@click.argument("name")
@json_flag
@pass_ctx
def rollout_show_cmd(ctx: Context, name: str, as_json: bool) -> None:
    """The model's newest wave rollout: each wave's state and its gate's figures."""
    ctx.catalog.versions(name)  # the model exists
    rollout = rollout_state(ctx, name)
    if rollout is None:
        raise RegistryError(f"{name} has never been rolled out in waves")
    emit(as_json, rollout, lambda: tables.rollout_view(out, rollout))


def _steer(ctx: Context, name: str, action: str, as_json: bool) -> None:
    ctx.catalog.versions(name)  # the model exists
    with anchor.audited(ctx.catalog.db, ctx.catalog.anchor) as conn:
        r = waves.steer(conn, name, action, ctx.settings.actor, time.time())
    emit(as_json, r.to_json(), lambda: out.print(
        f"{name}: rollout of version {r.version} {r.state} at wave {r.wave + 1}/"
        f"{len(r.policy.waves)}" + (" (every node goes back to version "
                                    f"{r.previous})" if r.state == "aborted" else "")))


@rollout_group.command("pause")
@click.argument("name")
@json_flag
@pass_ctx
def rollout_pause_cmd(ctx: Context, name: str, as_json: bool) -> None:
    """Hold the rollout where it is: admitted nodes keep the new version, no gate runs."""
    _steer(ctx, name, "pause", as_json)


@rollout_group.command("resume")
@click.argument("name")
@json_flag
@pass_ctx
def rollout_resume_cmd(ctx: Context, name: str, as_json: bool) -> None:
    """Go on with a paused or halted rollout: its current wave is admitted and judged again."""
    _steer(ctx, name, "resume", as_json)


@rollout_group.command("abort")
@click.argument("name")
@json_flag
@pass_ctx
def rollout_abort_cmd(ctx: Context, name: str, as_json: bool) -> None:
    """End the rollout: every node goes back to production."""
    _steer(ctx, name, "abort", as_json)


@cli.command("replication")
@json_flag
@pass_ctx
def replication_cmd(ctx: Context, as_json: bool) -> None:
    """This registry's part in a replicated group: its role (standalone, primary, standby),
    term, primary, lease, how far its data goes and, on a primary, each standby's position
    and lag (read from the database: works on a stopped registry too)."""
    conn = ctx.catalog.db.conn
    state = role.state(conn)
    at = changes.position(conn)
    now = time.time()
    standbys = [{"registry_id": r[0], "position": int(r[1]), "behind": max(at - int(r[1]), 0),
                 "acked_s_ago": round(now - float(r[2]), 1)}
                for r in conn.execute("SELECT replica, position, acked_at FROM replicas "
                                      "ORDER BY replica")]
    data = {"role": state.role, "registry_id": state.registry_id, "term": state.term,
            "primary": state.leader, "writable": state.writable,
            "lease_s_left": round(max(state.lease_until - now, 0), 1)
            if state.role == "primary" else None,
            "position": at, "history_term": state.history_term,
            "async_commits": state.async_commits, "standbys": standbys}

    def human() -> None:
        out.print(f"{state.role} {escape(state.registry_id or '')} (term {state.term}), "
                  f"{'accepting writes' if state.writable else 'refusing writes'}; data up to "
                  f"change {at}")
        if state.role == "standby":
            out.print(f"  primary: {escape(state.leader or 'not known yet')}")
        for row in standbys:
            out.print(f"  standby {escape(row['registry_id'])}: change {row['position']} "
                      f"({row['behind']} behind), last ack {row['acked_s_ago']}s ago")
        if state.async_commits:
            out.print(f"  {state.async_commits} change(s) committed without a standby "
                      f"(REGISTRY_SYNC_TIMEOUT_S)")

    emit(as_json, data, human)


@cli.command("cascade")
@click.argument("name")
@click.option("--mode", type=click.Choice(["auto", "static"]), default=None,
              help="auto: edges hold their escalations to budgets from the centers' capacity; "
                   "static: every edge keeps the release's calibrated threshold.")
@click.option("--capacity", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Rows per second all centers take, instead of what they report.")
@click.option("--measured", is_flag=True, help="Use the centers' reported capacity again.")
@click.option("--split", type=click.Choice(["traffic", "equal"]), default=None,
              help="How the capacity is split over the edges (default traffic).")
@click.option("--max-capacity", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Ceiling (rows/s) on the capacity the centers report: budgets never add "
                   "up to more, whatever a node says.")
@click.option("--no-max-capacity", is_flag=True, help="Remove the ceiling.")
@json_flag
@pass_ctx
def cascade_cmd(ctx: Context, name: str, mode: str | None, capacity: float | None,
                measured: bool, split: str | None, max_capacity: float | None,
                no_max_capacity: bool, as_json: bool) -> None:
    """Show or change NAME's cascade policy (audited when it changes): how ``registry serve``
    turns the centers' capacity into each edge's escalation budget (docs/cascade.md)."""
    if capacity is not None and measured:
        raise click.UsageError("--capacity and --measured contradict each other")
    if max_capacity is not None and no_max_capacity:
        raise click.UsageError("--max-capacity and --no-max-capacity contradict each other")
    catalog = ctx.catalog
    check_name(name)
    policy = budgets.policies(catalog.db).get(name, budgets.CascadePolicy(
        split=ctx.settings.budget_split))
    if mode or capacity is not None or measured or split or max_capacity or no_max_capacity:
        policy = budgets.set_policy(catalog.db, catalog.anchor, ctx.settings.actor, name,
                                    budgets.CascadePolicy(
                                        mode or policy.mode,  # type: ignore[arg-type]
                                        None if measured else (capacity or
                                                               policy.capacity_rows_s),
                                        split or policy.split,  # type: ignore[arg-type]
                                        None if no_max_capacity else (
                                            max_capacity or policy.max_capacity_rows_s)))
    data = {"model": name, "mode": policy.mode, "capacity_rows_s": policy.capacity_rows_s,
            "split": policy.split, "max_capacity_rows_s": policy.max_capacity_rows_s}
    given = ("reported by the centers" if policy.capacity_rows_s is None
             else f"{policy.capacity_rows_s:g} rows/s")
    ceiling = ("" if policy.max_capacity_rows_s is None
               else f" (at most {policy.max_capacity_rows_s:g} rows/s)")
    emit(as_json, data, lambda: out.print(f"{name}: cascade {policy.mode}, capacity {given}"
                                          f"{ceiling}, split by {policy.split}"))


@cli.group("node")
def node_group() -> None:
    """Node identities: each edge and center has its own token (and, provisioned, its own
    certificate); the registry believes a node's tier and region only as issued here."""


tier_option = click.option("--tier", type=click.Choice(["edge", "center"]), required=True,
                           help="The node's tier: the registry takes it from the token, never "
                                "from the node's hello.")
region_option = click.option("--region", required=True,
                             help="The node's region tag (as its --region): lower-case "
                                  "letters, digits and '-'. A hello naming another is refused.")


@node_group.command("provision")
@click.argument("node_id")
@tier_option
@region_option
@click.option("--out", "path", type=click.Path(path_type=Path), default=None,
              help="The bundle file to write (mode 0600; it holds the node's private key). "
                   "Required: a private key is never printed.")
@click.option("--ca", "ca_dir", type=click.Path(path_type=Path), default=None,
              help="Fleet CA folder (default REGISTRY_CA_DIR, else <home>/tls; made on first "
                   "use).")
@click.option("--host", "hosts", multiple=True,
              help="Another name or address the node is reached at, put in its certificate "
                   "(repeat).")
@json_flag
@pass_ctx
def node_provision_cmd(ctx: Context, node_id: str, tier: str, region: str, path: Path | None,
                       ca_dir: Path | None, hosts: tuple[str, ...], as_json: bool) -> None:
    """Make NODE_ID's bundle (audited): its token at the current generation (naming its tier
    and region), a fresh key and certificate from the fleet CA, the CA, and the audit chain's
    head as its directive floor. Copy the file to the node and start it with it."""
    from registry.trust.provision import ProvisionError, check, provision

    if path is None:
        raise click.UsageError("the bundle holds the node's private key, which is never "
                               "printed: give --out FILE (written mode 0600). `registry node "
                               "token` prints a token alone")
    try:
        check(ctx.settings, node_id, tier, region)
    except ProvisionError as exc:
        raise click.UsageError(str(exc)) from exc
    ctx.catalog  # noqa: B018 - creates and migrates the database (and sweeps) first
    made = provision(ctx.settings, node_id, tier, region, hosts, ca_dir, path)
    data = {"node": node_id, "tier": tier, "region": region, "bundle": str(path),
            "generation": parse(made.token).generation,
            "directive_floor": made.directive_floor}
    emit(as_json, data, lambda: out.print(
        f"wrote {escape(node_id)}'s bundle ({tier}, region {escape(region)}, token generation "
        f"{data['generation']}, directive floor {made.directive_floor}) to {escape(str(path))}: "
        f"copy it to the node (it holds the node's private key)"))


@node_group.command("token")
@click.argument("node_id")
@tier_option
@region_option
@click.option("--out", "path", type=click.Path(path_type=Path), default=None,
              help="Write the token to this file (mode 0600) instead of printing it.")
@pass_ctx
def node_token_cmd(ctx: Context, node_id: str, tier: str, region: str,
                   path: Path | None) -> None:
    """The registry token of NODE_ID alone (for a node without its own certificate; `node
    provision` makes the whole bundle): derived from REGISTRY_TOKEN, the node's current
    generation, tier and region, so the registry stores no per-node secret. It proves NODE_ID,
    as that tier in that region, and no other node."""
    settings = ctx.settings
    if settings.token is None:
        raise click.UsageError("node tokens are derived from the registry's secret: set "
                               "REGISTRY_TOKEN (or REGISTRY_TOKEN_FILE)")
    generation = NodeBook(ctx.catalog.db).generations().get(node_id, 1)
    try:
        token = node_token(settings.token.get_secret_value(), node_id, tier, region,
                           generation)
    except TokenError as exc:
        raise click.UsageError(str(exc)) from exc
    if path is None:
        click.echo(token)
        return
    write_secret(path, f"{token}\n".encode())
    err.print(f"wrote {escape(node_id)}'s token to {path}")


@node_group.command("revoke")
@click.argument("node_id")
@pass_ctx
def node_revoke_cmd(ctx: Context, node_id: str) -> None:
    """Void NODE_ID's token (audited): ``registry serve`` closes its stream and refuses the old
    token; ``registry node provision NODE_ID`` then issues the new generation."""
    if not NODE_ID.fullmatch(node_id):
        raise click.UsageError(f"invalid node id {node_id[:64]!r}")
    catalog = ctx.catalog
    generation = NodeBook(catalog.db, catalog.anchor).revoke(node_id, ctx.settings.actor)
    out.print(f"revoked {escape(node_id)}'s token; its new one is generation {generation} "
              f"(`registry node provision {escape(node_id)} --tier T --region R --out FILE`)")


@cli.command("tls")
@click.option("--out", "folder", type=click.Path(path_type=Path), required=True,
              help="Folder for ca.pem/ca.key and the server certificates.")
@click.option("--host", "hosts", multiple=True, default=("127.0.0.1", "localhost"),
              show_default=True, help="Name or address the servers are reached at (repeat).")
def tls_cmd(folder: Path, hosts: tuple[str, ...]) -> None:
    """Make a fleet CA (or reuse the one in --out) and sign a registry and a center
    certificate with it: registry serve --tls-cert/--tls-key, center *_TLS_CERT/KEY; nodes pin
    ca.pem (*_REGISTRY_CA, EDGE_CENTER_CA)."""
    from registry.trust import pki

    try:
        made = pki.fleet(folder, list(hosts))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    for path in made:
        out.print(str(path))


@cli.command("serve")
@settings_options(RegistrySettings, ("host", "grpc_port", "metrics_port", "tls_cert", "tls_key",
                                   "ha", "follow"),
                  flags={"grpc_port": "port"},
                  overrides={**{name: {"type": click.Path(path_type=Path, exists=True)}
                                for name in ("tls_cert", "tls_key")},
                             "ha": {"is_flag": True, "type": bool}})
@pass_ctx
def serve_cmd(ctx: Context, host: str | None, grpc_port: int | None,
              metrics_port: int | None, tls_cert: Path | None, tls_key: Path | None,
              ha: bool | None, follow: str | None) -> None:
    """Serve model sync over gRPC: push releases to every subscribed edge and center, send
    artifacts (resumable), record acks and quality reports. Needs REGISTRY_TOKEN."""
    from registry.server.app import run  # grpc loads here only

    flags = {"host": host, "grpc_port": grpc_port, "metrics_port": metrics_port,
             "tls_cert": tls_cert, "tls_key": tls_key, "ha": ha or None,
             "follow": follow}
    s = ctx.settings
    current = {name: getattr(s, name) for name in s.model_fields_set}
    try:
        settings = RegistrySettings(**{**current, **{k: v for k, v in flags.items()
                                                     if v is not None}})
    except ValidationError as exc:
        raise click.UsageError(f"invalid settings: {exc}") from exc
    if settings.token is None:
        raise click.UsageError("registry serve needs its secret: set REGISTRY_TOKEN (at least "
                               "16 characters) or REGISTRY_TOKEN_FILE")
    if settings.ha and not settings.consul_http_addr:
        raise click.UsageError("--ha elects the primary through Consul: set CONSUL_HTTP_ADDR")
    if settings.ha and settings.follow:
        raise click.UsageError("--ha finds the primary in Consul; --follow names one: not both")
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise click.UsageError("TLS needs both --tls-cert and --tls-key")
    ctx.catalog  # noqa: B018 - creates and migrates the database before serving
    run(settings)


@cli.command("backup")
@click.argument("dest", type=click.Path(path_type=Path))
@json_flag
@pass_ctx
def backup_cmd(ctx: Context, dest: Path, as_json: bool) -> None:
    """Write a consistent copy of the registry home into the new folder DEST while it keeps
    working: the database (SQLite online backup), its blobs (rehashed), the signed audit head,
    the public key and a manifest (backup.json). Records nothing; the private key is kept
    apart."""
    from registry.ha.backup import backup

    result = backup(ctx.settings, dest)
    m = result.manifest
    head = m["audit_head"]["seq"] if m["audit_head"] else 0
    emit(as_json, {**m, "path": str(dest), "timings": result.timings}, lambda: out.print(
        f"backed up {m['counts']['models']} models, {m['counts']['versions']} versions, "
        f"audit head seq {head}, {len(m['blobs'])} blobs ({m['blob_bytes']:,} bytes) to "
        f"{escape(str(dest))} in {result.timings['total']:.1f} s"))


@cli.command("restore")
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--home", "target", type=click.Path(path_type=Path), default=None,
              help="Registry home to rebuild [default REGISTRY_HOME].")
@click.option("--force", is_flag=True, help="Replace an existing home (moved aside to "
              "<home>.replaced-<time>, never deleted).")
@json_flag
@pass_ctx
def restore_cmd(ctx: Context, src: Path, target: Path | None, force: bool, as_json: bool) -> None:
    """Rebuild a registry home from the backup SRC, after checking it all (manifest, sha256 of
    the database and every blob, integrity_check, the audit chain and its signed head)."""
    from registry.ha.backup import notes, restore

    result = restore(ctx.settings, src, target or ctx.settings.home, force)

    def human() -> None:
        out.print(f"restored {escape(str(result.home))} from {escape(str(src))}: audit chain "
                  f"of {result.checked} records verified (head seq {result.head_seq}), "
                  f"{result.blobs} blobs checked")
        if result.replaced is not None:
            out.print(f"the old home was moved aside to {escape(str(result.replaced))}"
                      + (f" ({', '.join(result.carried)} copied from it)" if result.carried
                         else ""))
        for line in notes(result):
            out.print(escape(line))
        for line in result.warnings:
            err.print(f"[yellow]warning:[/] {escape(line)}")

    emit(as_json, result.to_json(), human)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="registry", standalone_mode=False)
    except click.exceptions.Abort:
        err.print("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except RegistryError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        sys.exit(exc.exit_code)
    except StoreError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        sys.exit(5)
