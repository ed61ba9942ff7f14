"""NATS JWT mode without nsc: an operator, the PARTKEEPER account with one scoped signing key
per role of the permission table (bus/permissions.py, rendered with `{{tag(node)}}` as
deploy/nats/signing-keys.sh is), and users tagged with their node, as `.creds` files.

The claims follow nats-io/jwt v2 (`jwt/v2`: `ClaimsData` iss/sub/iat/jti, `nats.type` and
`nats.version: 2`; an account's `signing_keys` entry of kind `user_scope` with a `role` and a
`template` of user permissions; a user signed by such a key names `issuer_account` and carries
no permissions of its own), the header `{"typ":"JWT","alg":"ed25519-nkey"}`, the signature
ed25519 over `header.claims`, all base64url without padding; the server runs with the memory
resolver (`resolver: MEMORY`, `resolver_preload`). nkeys (PyPI) makes and signs the keys.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys

from partkeeper.bus.permissions import ROLES
from partkeeper.bus.permissions_render import TAG


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def keypair(prefix: int) -> nkeys.KeyPair:
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def _public(kp: nkeys.KeyPair) -> str:
    return str(kp.public_key.decode())


def encode(claims_nats: dict[str, Any], *, subject: str, name: str,
           issuer: nkeys.KeyPair) -> str:
    header = {"typ": "JWT", "alg": "ed25519-nkey"}
    claims = {"jti": secrets.token_hex(16).upper(), "iat": int(time.time()),
              "iss": _public(issuer), "name": name, "sub": subject, "nats": claims_nats}
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    return f"{signing_input}.{_b64(issuer.sign(signing_input.encode()))}"


UNLIMITED = {"subs": -1, "data": -1, "payload": -1}


@dataclass
class Operator:
    """The operator, the account and one signing key per role; users minted on demand."""

    operator: nkeys.KeyPair
    account: nkeys.KeyPair
    system: nkeys.KeyPair  # JetStream needs a system account in operator mode
    roles: dict[str, nkeys.KeyPair]

    @classmethod
    def made(cls) -> Operator:
        return cls(keypair(nkeys.PREFIX_BYTE_OPERATOR), keypair(nkeys.PREFIX_BYTE_ACCOUNT),
                   keypair(nkeys.PREFIX_BYTE_ACCOUNT),
                   {r.name: keypair(nkeys.PREFIX_BYTE_ACCOUNT) for r in ROLES})

    def operator_jwt(self) -> str:
        return encode({"type": "operator", "version": 2}, subject=_public(self.operator),
                      name="partkeeper-test", issuer=self.operator)

    def account_jwt(self) -> str:
        keys = []
        for role in ROLES:
            rendered = role.render(TAG)
            pub: dict[str, list[str]] = {"allow": list(rendered.publish)}
            if rendered.deny_publish:
                pub["deny"] = list(rendered.deny_publish)
            template: dict[str, Any] = {"pub": pub, "sub": {"allow": list(rendered.subscribe)},
                                        **UNLIMITED}
            keys.append({"kind": "user_scope", "key": _public(self.roles[role.name]),
                         "role": role.name, "template": template})
        limits = {"imports": -1, "exports": -1, "wildcards": True, "conn": -1, "leaf": -1,
                  "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
                  **UNLIMITED}
        return encode({"limits": limits, "signing_keys": keys, "default_permissions":
                       {"pub": {}, "sub": {}}, "type": "account", "version": 2},
                      subject=_public(self.account), name="PARTKEEPER", issuer=self.operator)

    def system_jwt(self) -> str:
        return encode({"limits": {"imports": -1, "exports": -1, "wildcards": True, "conn": -1,
                                  "leaf": -1, **UNLIMITED}, "type": "account", "version": 2},
                      subject=_public(self.system), name="SYS", issuer=self.operator)

    def server_config(self, directory: Path) -> Path:
        """A server configuration in operator mode trusting this operator and its accounts."""
        path = directory / "nats-jwt.conf"
        path.write_text(
            f'operator: "{self.operator_jwt()}"\n'
            f"system_account: {_public(self.system)}\n"
            "resolver: MEMORY\n"
            f'resolver_preload: {{\n  {_public(self.account)}: "{self.account_jwt()}"\n'
            f'  {_public(self.system)}: "{self.system_jwt()}"\n}}\n')
        return path

    def creds(self, role: str, node_token: str | None, directory: Path) -> Path:
        """A `.creds` file for a user of `role`, tagged with the node (none: provisioning)."""
        user = keypair(nkeys.PREFIX_BYTE_USER)
        # A scoped user carries no permissions or limits of its own (the server refuses one
        # that does: "scoped users require no permissions or limits set").
        claims: dict[str, Any] = {"issuer_account": _public(self.account), "type": "user",
                                  "version": 2}
        if node_token:
            claims["tags"] = [f"node:{node_token}"]
        token = encode(claims, subject=_public(user), name=f"{role}-{node_token or 'cluster'}",
                       issuer=self.roles[role])
        path = directory / f"{role}-{node_token or 'cluster'}.creds"
        path.write_text(
            "-----BEGIN NATS USER JWT-----\n" + token + "\n------END NATS USER JWT------\n\n"
            "-----BEGIN USER NKEY SEED-----\n" + user.seed.decode()
            + "\n------END USER NKEY SEED------\n")
        path.chmod(0o600)
        return path
