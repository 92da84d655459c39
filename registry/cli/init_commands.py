"""``registry init``: make a registry home on purpose (the database and the signing key), the
one way besides ``publish --create`` and ``registry serve`` that a new home comes to be."""

from __future__ import annotations

import click

from registry.cli.context import Context, emit, json_flag, out, pass_ctx
from registry.trust import keys


@click.command("init")
@json_flag
@pass_ctx
def init_cmd(ctx: Context, as_json: bool) -> None:
    """Create the registry home (REGISTRY_HOME or --home): its database and, unless
    REGISTRY_SIGNING_KEY names one, its signing key (keys/signing.key). Run again, it makes
    only what is missing and says so."""
    settings = ctx.settings
    made = []
    if not settings.database.is_file():
        made.append(settings.database.name)
    ctx.create = True
    ctx.catalog  # noqa: B018 - creates and migrates the database
    key = settings.signing_key_path
    if settings.signing_key is None and not key.exists():
        keys.signer(settings)
        made.append(str(key.relative_to(settings.home)))
    data = {"created": made, "database": str(settings.database), "signing_key": str(key)}
    emit(as_json, data, lambda: out.print(
        f"made {', '.join(made)} in {settings.home}" if made else
        f"{settings.home} is a registry already: nothing to make", soft_wrap=True))


# registered on the ``registry`` group by registry.cli.main
COMMANDS = (init_cmd,)
