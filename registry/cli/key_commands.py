"""``registry key`` (and ``key rotate``), ``keygen``, ``sign`` and ``tls``: the keys releases
are signed with, the TUF roles, the fleet CA."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import click

from registry.cli import tables
from registry.cli.context import Context, emit, err, json_flag, out, pass_ctx, split_ref
from registry.errors import NotPrimary, RegistryError
from registry.store import chain
from registry.store.db import read
from registry.trust import keys, tuf
from registry.trust.anchor import audited


@click.group("key", invoke_without_command=True)
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


@click.command("keygen")
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


@click.command("sign")
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


@click.command("tls")
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


# registered on the ``registry`` group by registry.cli.main
COMMANDS = (key_cmd, keygen_cmd, sign_cmd, tls_cmd)
