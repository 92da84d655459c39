"""What every ``registry`` command shares: the :class:`Context` (settings, the catalog opened
on first use, the replication wait after a write), the consoles, ``--json`` output and the
errors turned into exit codes."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from registry.cli.home import Home
from registry.errors import NotPrimary, RegistryError
from registry.ha import changes
from registry.releases.catalog import Catalog
from registry.settings import RegistrySettings
from registry.store import role
from registry.store.blobs import BlobStore
from registry.store.db import connect
from registry.store.private import PRIVATE_UMASK
from registry.trust import anchor
from serving.release.store import StoreError

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


class Context:
    """What a command is handed (``pass_ctx``): the settings, the home they name (and how it
    was chosen), and the catalog, opened when a command first asks for it. ``create``: a
    command that makes its home on purpose (``init``, ``publish --create``, ``serve``)."""

    def __init__(self, settings: RegistrySettings, home: Home | None = None) -> None:
        self.home = home or Home(settings.home, "settings")
        self.settings = settings.model_copy(update={"home": self.home.path})
        self._catalog: Catalog | None = None
        self.opened_at = 0
        self.create = False
        self.home_used = False
        self.home_said = False

    def check_home(self) -> Home:
        """The home, refused (one line, before anything is written) when it holds no registry
        unless the command creates it."""
        if not self.create:
            self.home.require()
        return self.home

    def use_home(self) -> Home:
        """The home, checked; the command says it once it has done its work (``say_home``)."""
        self.check_home()
        self.home_used = True
        return self.home

    def say_home(self) -> None:
        """``registry home: …`` on stderr, once, when the command used one: after its output
        on success (a refusal stays one line), or as a long-running command starts."""
        if self.home_used and not self.home_said:
            err.print(escape(self.home.describe()), soft_wrap=True)
            self.home_said = True

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self.use_home()
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

json_flag = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")


def emit(as_json: bool, data: Any, human: Callable[[], None]) -> None:
    """``data`` as JSON (an object gets ``"home"`` when the command used one), or ``human()``."""
    if as_json:
        click_ctx = click.get_current_context(silent=True)
        ctx = click_ctx.find_object(Context) if click_ctx else None
        if isinstance(data, dict) and ctx is not None and ctx.home_used:
            data = {**data, "home": str(ctx.home.path)}
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        human()


def split_ref(ref: str) -> tuple[str, str | None]:
    name, _, version = ref.partition("@")
    return name, version or None


def run(cli: click.Group, argv: list[str] | None) -> None:
    """Run the ``registry`` group; an error ends the process with its message and exit code:
    click's own (2 for usage), a :class:`RegistryError`'s, 5 for the model store, 130 for ^C."""
    os.umask(PRIVATE_UMASK)  # what it writes into a home (keys, certificates...) is private
    try:
        cli.main(args=argv, prog_name="registry", standalone_mode=False)
    except click.exceptions.Abort:
        err.print("aborted")
        sys.exit(130)
    except click.UsageError as exc:  # one line, as every refusal (click's takes three)
        message = " ".join(exc.format_message().split())
        hint = f" (`{exc.ctx.command_path} -h` for help)" if exc.ctx else ""
        err.print(f"[red]error:[/] {escape(message)}{escape(hint)}", soft_wrap=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except RegistryError as exc:  # one line, whatever the message quotes
        err.print(f"[red]error:[/] {escape(' '.join(str(exc).split()))}", soft_wrap=True)
        sys.exit(exc.exit_code)
    except StoreError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)  # one line
        sys.exit(5)
