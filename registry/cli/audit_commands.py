"""``registry audit``, ``backup`` and ``restore``: the audit log, and a checked copy of the
registry home."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from registry.cli import tables
from registry.cli.context import Context, emit, err, json_flag, out, pass_ctx
from registry.errors import AuditChainBroken, RegistryError
from registry.store import chain
from registry.trust import anchor, keys


@click.command("audit")
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


@click.command("backup")
@click.argument("dest", type=click.Path(path_type=Path))
@json_flag
@pass_ctx
def backup_cmd(ctx: Context, dest: Path, as_json: bool) -> None:
    """Write a consistent copy of the registry home into the new folder DEST while it keeps
    working: the database (SQLite online backup), its blobs (rehashed), the signed audit head,
    the public key and a manifest (backup.json). Records nothing; the private key is kept
    apart."""
    from registry.ha.backup import backup

    ctx.use_home()
    result = backup(ctx.settings, dest)
    m = result.manifest
    head = m["audit_head"]["seq"] if m["audit_head"] else 0
    emit(as_json, {**m, "path": str(dest), "timings": result.timings}, lambda: out.print(
        f"backed up {m['counts']['models']} models, {m['counts']['versions']} versions, "
        f"audit head seq {head}, {len(m['blobs'])} blobs ({m['blob_bytes']:,} bytes) to "
        f"{escape(str(dest))} in {result.timings['total']:.1f} s"))


@click.command("restore")
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


# registered on the ``registry`` group by registry.cli.main
COMMANDS = (audit_cmd, backup_cmd, restore_cmd)
