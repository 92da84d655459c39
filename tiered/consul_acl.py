"""Consul with ACLs as the launcher runs it: default deny, a policy and a token per role
(``consul/policies/<role>.hcl``, shared with docker-compose.yml), each child handed its role's
token as CONSUL_HTTP_TOKEN. The secrets go in 0600 files, never on a command line (``ps``
shows argv to anyone)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

from serving.config.tokens import write_secret

CONSUL_POLICIES = Path(__file__).resolve().parent.parent / "consul" / "policies"  # <role>.hcl
# a policy and a token each (prometheus: the target renderer's read-only token)
CONSUL_ROLES = ("agent", "registry", "center", "edge", "reader", "prometheus")


@dataclass
class ConsulAcl:
    """One fleet's ACL tokens, the agent config that turns ACLs on with them, and the policies
    and tokens made in Consul through its API."""

    folder: Path  # <root>/consul (0700)
    tokens: dict[str, str]  # role (+ "management") -> secret: the fleet's own dict, filled
    # once, so a restarted (empty) dev agent gets the very same ones

    @property
    def token_file(self) -> Path:
        """The management token (0600): ``tiered status`` reads it; log in to the UI with it."""
        return self.folder / "management.token"

    def agent_config(self) -> Path:
        """A 0600 file that turns ACLs on (default deny) with the management and agent tokens,
        for the agent's ``-config-file``; the tokens are made on first use."""
        for role in ("management", *CONSUL_ROLES):  # a role added since: its token made now
            self.tokens.setdefault(role, str(uuid.uuid4()))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o700)
        config = self.folder / "acl.json"  # Consul 1.8: "master" (later "initial_management")
        tokens = {"master": self.tokens["management"], "agent": self.tokens["agent"]}
        write_secret(config, json.dumps({"acl": {
            "enabled": True, "default_policy": "deny", "down_policy": "extend-cache",
            "tokens": tokens}}, indent=2).encode())
        write_secret(self.token_file, f"{self.tokens['management']}\n".encode())
        return config

    def setup(self, consul: str) -> bool:
        """Create each role's policy and its token in the Consul at ``consul`` (host:port),
        with the secret the children were given; False while the ACL system is not up yet."""
        api = httpx.Client(base_url=f"http://{consul}/v1", timeout=5,
                           headers={"X-Consul-Token": self.tokens["management"]})
        with api:
            if api.get("/acl/token/self").status_code != 200:
                return False
            for role in CONSUL_ROLES:
                name = f"tiered-{role}"
                policy = api.put("/acl/policy", json={
                    "Name": name, "Rules": (CONSUL_POLICIES / f"{role}.hcl").read_text(),
                    "Description": f"Tiered {role} (consul/policies/{role}.hcl)"})
                token = api.put("/acl/token", json={
                    "SecretID": self.tokens[role], "Description": name,
                    "Policies": [{"Name": name}]})
                for answer in (policy, token):
                    if answer.status_code != 200:
                        raise RuntimeError(f"Consul refused the {name} ACL setup: "
                                           f"{answer.status_code} {answer.text[:300]}")
        return True
