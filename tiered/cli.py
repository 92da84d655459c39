"""The ``tiered`` command: ``up`` runs the whole stack locally, ``demo`` sends the demo's test
split through it, ``status`` joins Consul's health with the registry's rollout state, ``report``
sums up the last 30 days from Prometheus (``tiered.report``)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click
import httpx
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from serving.config.flags import options
from serving.fleet import discovery
from serving.fleet.discovery import SERVICES
from tiered import demo as demo_run
from tiered import netns, releases
from tiered.commands import BIN, registry_cli
from tiered.console.command import console_cmd
from tiered.monitoring import prometheus
from tiered.report.command import report_cmd
from tiered.running import RunningFleet, load_state
from tiered.settings import TieredSettings
from tiered.sites import Sites
from tiered.stack import Stack
from tiered.views import demo_view, registry_database, status_rows, status_view, summary_view

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)
ROOT = Path(__file__).resolve().parent.parent
COLOURS = ["cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_green"]


def settings_from(**flags: Any) -> TieredSettings:
    try:
        return TieredSettings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        raise click.UsageError(f"invalid settings: {exc}") from exc


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Tiered's local launcher: the whole stack (Consul, registry, center, edges, nginx)."""


@cli.command("up")
@options(TieredSettings, ("http_port", "grpc_port", "consul_port", "prometheus_port",
                         "alertmanager_port", "alertmanager_config", "root", "otlp_endpoint"))
@click.option("--timeout", type=float, default=600, show_default=True,
              help="Seconds to wait for every health check.")
def up_cmd(http_port: int | None, grpc_port: int | None, consul_port: int | None,
           prometheus_port: int | None, alertmanager_port: int | None,
           alertmanager_config: Path | None, root: Path | None, otlp_endpoint: str | None,
           timeout: float) -> None:
    """Install what is missing, publish the demo if the registry has no release (the full one
    when it is built, else the quick one, with the full one trained behind and rolled out when
    done), start Consul (dev), registry serve, a center, two edges (eu, us) and nginx; wait
    until all are healthy; restart a registry, center or edge that dies; Ctrl-C stops
    everything."""
    s = settings_from(http_port=http_port, grpc_port=grpc_port, consul_port=consul_port,
                      prometheus_port=prometheus_port, alertmanager_port=alertmanager_port,
                      alertmanager_config=alertmanager_config, root=root,
                      otlp_endpoint=otlp_endpoint)
    started = time.monotonic()
    ensure_tools()
    choice = ensure_release(s)
    token = s.registry_token.get_secret_value() if s.registry_token else secrets.token_hex(16)
    stack = Stack(s.root.resolve(), s.registry_home.resolve(), token, s.http_port,
                  s.consul_port, grpc_port=s.grpc_port, tracing=tracing_env(s, os.environ),
                  echo=Printer(), nginx_flags=LOOPBACK_ENTRY, monitoring=True,
                  prometheus_port=s.prometheus_port, alertmanager_port=s.alertmanager_port,
                  alertmanager_config=(s.alertmanager_config.resolve() if s.alertmanager_config
                                       else prometheus.ALERTMANAGER_CONFIG))

    def start() -> None:
        stack.up(timeout)
        summary(stack, s, time.monotonic() - started)
        env = publish_settings(os.environ)
        if choice.train_behind:
            releases.Behind(stack, s, publish_env=env).start()
        if s.image_model:  # served beside the text model: built and published behind
            releases.Behind(stack, s, releases.build_argv(releases.IMAGE_BUILDER,
                                                          s.image_release),
                            publish_env=env, target=releases.images(s)).start()

    run_until_stopped(stack, start, "the stack")


def run_until_stopped(stack: RunningFleet, start: Callable[[], None], what: str) -> None:
    """Start ``stack``; restart a registry, center or edge that exits; stop everything on
    Ctrl-C or SIGTERM (while starting too: that cancels the wait) or when Consul or nginx
    exits (exit 1)."""
    stopping = stack.children.cancelled
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        start()
        stack.supervise()
        while not stopping.wait(0.5):
            dead = stack.children.dead()
            if dead:
                err.print(f"[red]{dead[0].name} exited ({dead[0].process.returncode}); "
                          f"stopping {what}[/] (log: {dead[0].log})")
                raise SystemExit(1)
    finally:
        err.print(f"stopping {what} …")
        stack.stop()
        err.print("stopped")


def tracing_env(s: TieredSettings, base: Mapping[str, str]) -> dict[str, str]:
    """The tiers' OpenTelemetry variables: ``--otlp-endpoint`` (plain gRPC for http://), else
    the OTEL_* variables tiered itself runs with."""
    if s.otlp_endpoint:
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": s.otlp_endpoint,
                "OTEL_EXPORTER_OTLP_INSECURE": str(s.otlp_endpoint.startswith("http:")).lower()}
    return {k: v for k, v in base.items() if k.startswith("OTEL_")}


class Printer:
    """Children's output, one line each, prefixed and coloured by child; JSON logs shortened
    to level and message."""

    def __init__(self) -> None:
        self.colours: dict[str, str] = {}
        self.lock = threading.Lock()

    def __call__(self, name: str, line: str) -> None:
        colour = self.colours.setdefault(name, COLOURS[len(self.colours) % len(COLOURS)])
        text = line
        if line.startswith("{"):
            try:
                entry = json.loads(line)
                text = f"{entry.get('level', ''):7} {entry.get('msg', line)}"
            except ValueError:
                pass
        with self.lock:
            err.print(f"[{colour}]{name:>11}[/] │ {escape(text)}", soft_wrap=True)


def ensure_tools() -> None:
    if (BIN / "consul").exists() and (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()) \
            and prometheus.binary(prometheus.PROMETHEUS_BIN) \
            and prometheus.binary(prometheus.ALERTMANAGER_BIN):
        return
    script = ROOT / "scripts" / "install_tools.sh"
    if not script.is_file():
        raise click.ClickException("consul, nginx, prometheus or prometheus-alertmanager is "
                                   "missing and scripts/install_tools.sh is not here to "
                                   "install them")
    subprocess.run(["bash", str(script)], check=True)


def publish_settings(base: Mapping[str, str]) -> dict[str, str]:
    """The ``REGISTRY_*`` settings tiered runs with (e.g. ``REGISTRY_MIN_FIDELITY``), for the
    releases it publishes: all but the home (the stack's) and the secrets (a publish needs
    none)."""
    return {k: v for k, v in base.items() if k.startswith("REGISTRY_")
            and k not in ("REGISTRY_HOME", "REGISTRY_TOKEN", "REGISTRY_TOKEN_FILE")}


def ensure_release(s: TieredSettings) -> releases.Choice:
    """Publish the demo release the stack starts on, unless the registry has it already: the
    full release when it is built, else the quick one (built in under a minute) when nothing
    is published. Says whether to train the full one behind."""
    choice = releases.choose(s)
    env = {"PATH": f"{BIN}:/usr/bin:/bin", **publish_settings(os.environ),
           "REGISTRY_HOME": str(s.registry_home), "HOME": str(Path.home())}
    if choice.start is releases.Start.PUBLISHED:
        # a registry from before signing: the stack's nodes refuse unsigned releases
        subprocess.run(registry_cli(s.registry_home, "sign", s.model), check=True, env=env,
                       stdout=subprocess.DEVNULL)
        if choice.train_behind:
            err.print(f"{s.model}: starting on the quick release; the full one trains behind")
        return choice
    if choice.start is releases.Start.FULL:
        folder = s.release
        err.print(f"{s.model}: the full demo release is built in {folder}; publishing it "
                  f"unless it is published already")
    else:
        folder = s.quick_release
        err.print(f"no {s.model} release in {s.registry_home}: building the quick demo release "
                  f"(under a minute) and publishing it"
                  + ("; the full one trains behind once the stack is up"
                     if choice.train_behind else ""))
    builder = s.trainer if choice.start is releases.Start.FULL else releases.QUICK_BUILDER
    subprocess.run(releases.build_argv(builder, folder), check=True, env=env)
    subprocess.run(releases.publish_argv(s, folder), check=True, env=env)
    return choice


# `tiered up` is one host's loopback: its entry also serves the center (full precision) and
# the registry's metrics, which its summary lists; nginx's own default is off for both
LOOPBACK_ENTRY = ("--expose-center", "--expose-registry-metrics")


def summary(stack: Stack, s: TieredSettings, seconds: float) -> None:
    pairs = [("entry (nginx)", f"{stack.url}/v2/models/{s.model}/infer"),
             ("full precision", f"{stack.url}/center/v2/models/{s.model}/infer")]
    if stack.grpc_port:
        pairs.append(("gRPC entry (nginx)", f"127.0.0.1:{stack.grpc_port} "
                                            f"(inference.GRPCInferenceService)"))
    pairs.append(("Consul UI", f"http://{stack.consul}/ui"))
    if stack.consul_acl:
        pairs.append(("Consul token", f"{stack.acl.token_file} (management: UI login, "
                                      f"CONSUL_HTTP_TOKEN; keep it private)"))
    if stack.prometheus_url:
        pairs.append(("Prometheus", f"{stack.prometheus_url}/targets (targets from Consul; "
                                    f"rules: monitoring/rules; loopback only)"))
    if stack.alertmanager_url:
        pairs.append(("Alertmanager", f"{stack.alertmanager_url} (receivers: "
                                      f"{stack.alertmanager_config})"))
    if "console" in stack.children:
        secret = stack.console_credential.read_text().strip()
        pairs.append(("fleet console", f"{stack.url}/console/ (read-only; user operator, "
                                       f"password {secret}: {stack.console_credential})"))
    pairs.append(("registry metrics", f"{stack.url}/registry/metrics"))
    pairs += [(f"{child.name} metrics", f"{stack.node_url(child.name)}/metrics")
              for child in stack.children.values() if child.role in ("edge", "center")]
    pairs.append(("fleet CA", f"{stack.tls / 'ca.pem'} (centers serve HTTPS: curl --cacert)"))
    pairs.append(("logs", str(stack.root / "logs")))
    endpoint = (stack.tracing.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or stack.tracing.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    pairs.append(("traces", f"OTLP/gRPC to {endpoint}" if endpoint else
                  "off (--otlp-endpoint or OTEL_EXPORTER_OTLP_ENDPOINT)"))
    out.print(summary_view(seconds, pairs))
    out.print(f"try:  curl -s {stack.url}/v2/models/{s.model}/infer -H 'X-Tiered-Region: eu' "
              f"-d '{{\"inputs\": [{{\"name\": \"text\", \"shape\": [1], \"datatype\": "
              f"\"BYTES\", \"data\": [\"A tedious slog.\"]}}]}}'")
    if s.image_model:
        out.print(f"images: tiered demo --model {s.image_model} (PNG digits; served once "
                  f"built and rolled out behind, ~1 min: tiered status)")
    out.print("then: tiered demo   |   tiered status   |   Ctrl-C stops everything")


@cli.command("sites")
@options(TieredSettings, ("root",))
@click.option("--edge-sites", default="eu,us", show_default=True,
              help="The edge sites (regions), comma-separated; a site's entry fails over to "
                   "the others in this order.")
@click.option("--edges-per-site", type=click.IntRange(1, 8), default=2, show_default=True)
@click.option("--prefix", default="10.77", show_default=True,
              help="The private /16 the hosts get addresses in (<prefix>.<site>.<n>).")
@click.option("--timeout", type=float, default=600, show_default=True,
              help="Seconds to wait for every health check.")
def sites_cmd(root: Path | None, edge_sites: str, edges_per_site: int, prefix: str,
              timeout: float) -> None:
    """Many sites on this machine (root): every host a network namespace with its own address.
    A center site (three Consul servers, a primary and a standby registry, the center) and
    edge sites (a Consul client agent, edges, an nginx entry each); TLS sync, HTTPS
    escalation, Consul gossip encryption and ACLs. Prints each site's entry; Ctrl-C stops
    everything."""
    why = netns.available()
    if why:
        raise click.ClickException(f"tiered sites needs network namespaces: {why}")
    s = settings_from(root=root)
    regions = tuple(r.strip() for r in edge_sites.split(",") if r.strip())
    bad = [r for r in regions if not discovery.REGION.fullmatch(r) or r == "core"]
    if bad or not regions:
        raise click.BadParameter(f"{bad[0] if bad else edge_sites!r}: a site is a region name "
                                 f"([a-z0-9-], not 'core')", param_hint="--edge-sites")
    try:
        network = netns.Network(prefix)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--prefix") from exc
    started = time.monotonic()
    ensure_tools()
    ensure_release(s.model_copy(update={"train_behind": False}))
    token = s.registry_token.get_secret_value() if s.registry_token else secrets.token_hex(16)
    sites = Sites(s.root.resolve() / "sites", s.registry_home.resolve(), token,
                  network=network, edge_sites=regions,
                  edges_per_site=edges_per_site, tracing=tracing_env(s, os.environ),
                  echo=Printer())

    def start() -> None:
        sites.network.create()
        sites.up(timeout)
        sites_summary(sites, s, time.monotonic() - started)

    run_until_stopped(sites, start, "the sites")


def sites_summary(sites: Sites, s: TieredSettings, seconds: float) -> None:
    pairs = []
    for site in sites.edge_sites:
        pairs.append((f"{site} entry (nginx)", f"{sites.entry(site)}/v2/models/{s.model}/infer"))
        pairs.append((f"{site} edges", ", ".join(sites.node_url(n) for n in sites.edges(site))))
    servers = [f"http://{h.address}:8500/ui" for h in sites.server_hosts]
    pairs += [("Consul servers (UI)", ", ".join(servers)),
              ("Consul token", f"{sites.acl.token_file} (management: UI login)"),
              ("registries (sync, TLS)", ", ".join(
                  f"{sites.host(n).address}:50051 ({role})"
                  for n, role in sites.registry_roles().items())),
              ("center (HTTPS)", sites.node_url("center-1")),
              ("Prometheus", f"{sites.prometheus_url}/targets (the center site's monitoring "
                             f"host; targets from its Consul agent)"),
              ("Alertmanager", f"{sites.alertmanager_url} (receivers: "
                               f"{sites.alertmanager_config})"),
              ("logs", str(sites.root / "logs"))]
    out.print(summary_view(seconds, pairs))
    first = sites.edge_sites[0]
    out.print(f"try:  curl -s {sites.entry(first)}/v2/models/{s.model}/infer -d "
              f"'{{\"inputs\": [{{\"name\": \"text\", \"shape\": [1], \"datatype\": "
              f"\"BYTES\", \"data\": [\"A tedious slog.\"]}}]}}'")
    out.print(f"then: tiered status --sites   |   tiered demo --url {sites.entry(first)}   |   "
              f"Ctrl-C stops everything")


@cli.group("swarm")
def swarm_group() -> None:
    """Tiered on Docker Swarm (deploy/swarm/stack.yml, docs/scaling.md)."""


@swarm_group.command("provision")
@click.option("--home", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="The registry's home on the node labelled registry=primary (the stack's "
                   "TIERED_REGISTRY_HOME): its database records every node provisioned.")
@click.option("--out", "folder", type=click.Path(path_type=Path, file_okay=False),
              required=True, help="A new folder (made 0700) for the stack's secrets: keep it "
                                  "offline, it holds the fleet CA's key and the registry's "
                                  "secret.")
def swarm_provision_cmd(home: Path, folder: Path) -> None:
    """Every secret the stack mounts: the registry's secret, signing key and TLS certificate,
    a provisioning bundle per node of the stack, Consul's tokens and gossip key. Prints the
    variables `docker stack deploy` reads (no secret is printed)."""
    from tiered.swarm import NODES, SwarmError, provision, stack_env

    try:
        made = provision(folder, home)
    except (SwarmError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    err.print(f"wrote {len(made)} files into {escape(str(folder))} (0700) and provisioned "
              f"{', '.join(NODES)} in {escape(str(home))}")
    for key, value in stack_env(folder, home).items():
        click.echo(f"export {key}={shlex.quote(value)}")


@cli.command("demo")
@click.option("--url", default=None, help="nginx entry (default: the running stack's).")
@click.option("--rows", type=click.IntRange(1, 2000), default=2000, show_default=True,
              help="Reviews (or digit images) of a demo's test split to send.")
@click.option("--concurrency", type=click.IntRange(1, 256), default=8, show_default=True)
@click.option("--region", default=None, help="X-Tiered-Region hint (nearest edge first).")
@click.option("--model", default=None, help="The model to send rows to: any served model with "
              "--data; without it, the text demo (reviews, the default) or the image demo "
              "(digit PNGs).")
@click.option("--data", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Your labelled rows: JSON Lines {\"text\"|\"image\"|<input>: ..., "
                   "\"label\": ...} or an .npz of the input's array and 'labels' (as "
                   "publish's --calibration).")
@click.option("--batch", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Rows of --data per request.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def demo_cmd(url: str | None, rows: int, concurrency: int, region: str | None,
             model: str | None, data: Path | None, batch: int, as_json: bool) -> None:
    """Send a demo's test split (or your own labelled rows) through nginx; print the
    accuracy, the tier split, p50/p99 per request and which edge answered."""
    s = settings_from()
    state = load_state(s.root) or {}
    target = url or state.get("url") or f"http://127.0.0.1:{s.http_port}"
    model = model or s.model
    headers = {"X-Tiered-Region": region} if region else {}
    if data is not None:
        requests, what = user_rows(target, model, data, batch, headers), "rows"
    elif model not in (s.model, s.image_model):
        raise UserMistake(f"{model!r} has no built-in demo data (the demos are {s.model!r} "
                          f"and {s.image_model!r}): pass --data FILE, JSON Lines or .npz")
    elif model == s.image_model and model != s.model:
        if not (s.image_release / "test.jsonl").is_file():
            raise click.ClickException(f"the image demo is not built in {s.image_release}: "
                                       f"tiered up builds it")
        requests, what = demo_run.image_requests(s.image_release, rows), "images"
    else:
        requests, what = demo_run.text_requests(rows), "reviews"
    outcome = asyncio.run(demo_run.run(target, model, rows, concurrency, region, requests))
    home = Path(state.get("registry_home", s.registry_home))
    result = {"url": target, "sent": outcome.sent, "failed": outcome.failed,
              "requests": outcome.requests, "batch": batch if data is not None else 1,
              "model": model, "what": what, "accuracy": outcome.accuracy,
              "by_version": by_version(outcome, s, home) if model == s.model else {
                  v: {"rows": n, "accuracy": outcome.correct_by_version[v] / n,
                      "release": None} for v, n in sorted(outcome.by_version.items())},
              "rows_by_tier": dict(outcome.rows_by_tier),
              "tier_split": {t: outcome.rows_by_tier.get(t, 0) for t in TIERS}
              | dict(outcome.rows_by_tier),
              "by_node": dict(outcome.by_node), "by_region": dict(outcome.by_region),
              "p50_ms": outcome.percentile(50), "p99_ms": outcome.percentile(99),
              "seconds": outcome.seconds, "errors": dict(outcome.errors)}
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        out.print(demo_view(result))
    if outcome.failed:
        raise SystemExit(1)


TIERS = ("edge", "center", "edge-shed", "degraded")  # what the `tier` output says answered


class UserMistake(click.ClickException):
    """A mistake in what the user asked: one line on stderr, exit 2 (click's usage errors
    print the usage too)."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))  # a reason quoted from a library may
        # carry newlines

def user_rows(url: str, model: str, path: Path, batch: int,
              headers: dict[str, str]) -> list[demo_run.DemoRequest]:
    """``--data``'s rows as requests for ``model``, as its V2 metadata (through ``url``)
    describes what it takes."""
    from tiered.demo_data import DataError, model_metadata, read_rows

    try:
        metadata = model_metadata(url, model, headers)
        return read_rows(path, metadata).requests(batch)
    except DataError as exc:
        raise UserMistake(str(exc)) from exc
    except httpx.HTTPError as exc:
        raise click.ClickException(f"{url} is not answering for model {model!r}: "
                                   f"{exc}") from exc


def by_version(outcome: demo_run.Outcome, s: TieredSettings,
               home: Path) -> dict[str, dict[str, Any]]:
    """Which release answered: rows and accuracy per model version, and whether the version is
    the demo's quick or full release (read from the registry at ``home`` where it is here)."""
    versions = [int(v) for v in outcome.by_version if v.isdigit()]
    kinds = (releases.kinds(s.model_copy(update={"registry_home": home}), versions)
             if registry_database(home).is_file() else {})  # else: --url of another machine
    return {v: {"rows": n, "accuracy": outcome.correct_by_version[v] / n,
                "release": kinds.get(int(v)) if v.isdigit() else None}
            for v, n in sorted(outcome.by_version.items())}


@cli.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--sites", "of_sites", is_flag=True,
              help="The fleet `tiered sites` runs (its state under <root>/sites).")
@click.option("--model", "only", multiple=True, metavar="NAME[,NAME...]",
              help="Only these models (repeatable, or comma-separated), each on every edge "
                   "and center: 'missing' where a node does not run it.")
def status_cmd(as_json: bool, of_sites: bool, only: tuple[str, ...]) -> None:
    """Consul's health of every Tiered service joined with `registry status`: every model on
    every edge and center (its version, the version wanted, its state), with the site of
    each instance."""
    from tiered import fleet_models

    s = settings_from()
    state = load_state(s.root / "sites" if of_sites else s.root) or {}
    if of_sites and not state:
        raise click.ClickException(f"no `tiered sites` running under {s.root / 'sites'}")
    consul = state.get("consul", f"127.0.0.1:{s.consul_port}")
    headers = consul_headers(state)
    home = Path(state.get("registry_home", s.registry_home))
    fleet = fleet_models.read(home)
    wanted = fleet_models.names(only)
    unknown = fleet.unknown(wanted)
    if unknown:
        raise UserMistake(f"{', '.join(map(repr, unknown))}: no such model in the registry "
                          f"at {home} (it has: {', '.join(fleet.known) or 'none'})")
    health: dict[str, list[dict[str, Any]]] = {}
    for service in (SERVICES["registry"], SERVICES["registry-standby"], SERVICES["center"],
                    SERVICES["edge"]):
        try:
            answer = httpx.get(f"http://{consul}/v1/health/service/{service}",
                               headers=headers, timeout=3)
        except httpx.HTTPError as exc:
            raise click.ClickException(f"Consul at {consul} is not answering: {exc}") from exc
        if answer.status_code != 200:
            raise click.ClickException(f"Consul at {consul} refused the health query "
                                       f"({answer.status_code}: {answer.text[:200]})")
        health[service] = answer.json()
    rows = status_rows(health, fleet.rollout, fleet.desired, wanted)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    out.print(status_view(rows, consul, out.width))
    for what, note in state.get("notes", {}).items():  # e.g. the full release trained behind
        out.print(f"{what}: {note['state']} (since {note['since']}): {note['detail']}")


def consul_headers(state: dict[str, Any]) -> dict[str, str]:
    """The running stack's management token (its 0600 file), else CONSUL_HTTP_TOKEN, else
    none: with ACLs on (``tiered up``'s default) an anonymous health query lists nothing."""
    file = state.get("consul_token_file")
    try:
        token = Path(file).read_text().strip() if file else os.environ.get("CONSUL_HTTP_TOKEN")
    except OSError as exc:
        raise click.ClickException(f"cannot read the Consul token in {file}: {exc}") from exc
    return {"X-Consul-Token": token} if token else {}


cli.add_command(console_cmd)
cli.add_command(report_cmd)


def main() -> None:
    try:
        cli.main(prog_name="tiered", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except subprocess.CalledProcessError as exc:
        err.print(f"[red]error:[/] {exc}")
        sys.exit(exc.returncode or 1)
    except (TimeoutError, RuntimeError) as exc:
        err.print(f"[red]error:[/] {exc}")
        sys.exit(1)


if __name__ == "__main__":  # `python -m tiered.cli` (the tests run the checkout's code so)
    main()
