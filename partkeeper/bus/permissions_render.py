"""The permission table (permissions.py) written out as each shipped form.

    python -m partkeeper.bus.permissions_render conf > compose/nats/nats.conf
    python -m partkeeper.bus.permissions_render helm > deploy/nats/accounts.yaml
    python -m partkeeper.bus.permissions_render nsc  > deploy/nats/signing-keys.sh

The shipped files are these outputs exactly (a test compares them); edit the table, not them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from partkeeper.bus.permissions import ADMIN_USER, NODE, ROLES, Role

SHIPPED_NODE = "sim-node-0"  # compose's simulated node
ACCOUNT = "PARTKEEPER"
# The account's JetStream limits (docs/operations.md, Sizing): the file store the default
# PK_STORE_BYTES (2 GiB) reserves with three replicas (deploy/), plus room, and no more than a
# server's own file store (compose's 8GB: a larger account limit stops the server at start);
# no memory streams; the six streams and buckets and nothing else; six streams' consumer
# limits (topology.MAX_CONSUMERS_PER_STREAM).
ACCOUNT_LIMITS = {"max_file": "7G", "max_mem": "64M", "max_streams": 6, "max_consumers": 60000}

_CONF_HEADER = """\
# NATS server configuration for partkeeper: one account, one user per service and one for
# provisioning, each allowed only the subjects it uses, written for the node "sim-node-0"
# (compose's simulated node).
#
# GENERATED from partkeeper/bus/permissions.py (python -m partkeeper.bus.permissions_render conf);
# tests/reliability/test_shipped_permissions.py fails when this file and the table differ.
#
# Development credentials: the passwords below are for compose and tests only. In a cluster use
# NATS JWTs (deploy/nats/signing-keys.sh and docs/security.md: scoped signing keys whose
# permission templates name the node, so one set of roles serves every node).
#
# The node name appears as its subject token (schemas.names.encode_token: letters, digits and '-'
# as themselves, anything else as '_' and two hex digits); "sim-node-0" needs no escaping.
#
# What every service needs besides its own subjects:
#   _INBOX.<node>.<service>.>  its private inbox (nats-py inbox_prefix): replies to its requests,
#                       JetStream API replies, pull and KV-watch deliveries; no one else's
#   _INBOX.<node>.<asker>.>, _INBOX.<node>.admin.>  (publish) where a service that answers
#                       requests may reply: the inboxes of this node's services that may ask it
#                       and the operators' inbox; no allow_responses, which would let a
#                       request's reply subject point a responder at a claim key or a stream
#   $JS.API.STREAM.INFO.<stream>  the readiness check that provisioning is done; only
#                       pk-provision may create or update, and no one deletes or purges
#   $JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<node>.>  KV reads of this node's keys only (the
#                       buckets have allow_direct, so the key is in the subject)
#   $JS.API.CONSUMER.CREATE.<stream>.*.<node's subjects>.>  the allocator's ordered watches
#                       (bus/ordered.py): named consumers, the filter in the subject, which the
#                       server holds the body to; this node's subjects only
#   $JS.FC.<stream>.>    flow control of the allocator's watches of that stream
#   $JS.ACK.<stream>.>   acks of its durable consumer
"""


def _quoted(subjects: tuple[str, ...], indent: str) -> str:
    return ",\n".join(f'{indent}"{s}"' for s in subjects)


def _conf_user(role: Role, password: str) -> str:
    lines = [
        f"      # {role.user}: {role.summary}.",
        f'      {{user: "{role.user}", password: "{password}",',
        "       permissions: {",
        "         publish: {allow: [",
        _quoted(role.publish, "           "),
        "         ]" + (", deny: [" if role.deny_publish else "},"),
    ]
    if role.deny_publish:
        lines += [_quoted(role.deny_publish, "           "), "         ]},"]
    lines += [
        "         subscribe: {allow: [",
        _quoted(role.subscribe, "           "),
        "         ]}",
        "       }}",
    ]
    return "\n".join(lines)


def nats_conf(node_token: str, passwords: Mapping[str, str], *, header: str = _CONF_HEADER,
              jetstream: bool = True) -> str:
    """A server configuration: the account, `pk-admin` and every role for one node.

    `passwords` maps user names (pk-admin, pk-watcher, ...) to their passwords."""
    users = [
        "      # Operators, `partkeeper status`, the demo and the tests: everything in the "
        "account.",
        f'      {{user: "{ADMIN_USER}", password: "{passwords[ADMIN_USER]}",',
        '       permissions: {publish: ">", subscribe: ">"}}',
    ]
    for role in ROLES:
        users += ["", _conf_user(role.render(node_token), passwords[role.user])]
    store = "jetstream {\n  max_memory_store: 256MB\n  max_file_store: 8GB\n}\n\n" if jetstream \
        else ""
    # Without a store of its own here (the embedded stack's server runs with its defaults, 75 %
    # of the free disk), the account asks for what one replica of the default store needs, so
    # a small disk still starts the server.
    limits = ", ".join(f"{k}: {v}" for k, v in {
        **ACCOUNT_LIMITS, **({} if jetstream else {"max_file": "3G"})}.items())
    return (f"{header}\n{store}accounts {{\n  {ACCOUNT} {{\n    jetstream: {{{limits}}}\n"
            "    users: [\n" + "\n".join(users) + "\n    ]\n  }\n}\n")


def dev_passwords() -> dict[str, str]:
    """compose's development passwords: pk-<name>-dev."""
    return {user: f"{user}-dev" for user in (ADMIN_USER, *(r.user for r in ROLES))}


def _yaml_list(subjects: tuple[str, ...], indent: str) -> list[str]:
    return [f'{indent}- "{s}"' for s in subjects]


def _env_name(user: str) -> str:
    return f"PK_{user.removeprefix('pk-').upper()}_PASSWORD"


_HELM_HEADER = """\
# partkeeper's NATS users for the official NATS Helm chart (1.x), as `config.merge`:
#   kubectl -n nats create secret generic partkeeper-nats-passwords \\
#     --from-literal=watcher=... --from-literal=allocator=... --from-literal=reclaimer=... \\
#     --from-literal=gc=... --from-literal=provision=... --from-literal=admin=...
#   helm install nats nats/nats -n nats -f deploy/nats/values.yaml -f deploy/nats/accounts.yaml
# GENERATED from partkeeper/bus/permissions.py (python -m partkeeper.bus.permissions_render helm);
# tests/reliability/test_shipped_permissions.py fails when this file and the table differ.
# Static users, written for ONE node name ("sim-node-0": replace it with your node's subject token,
# docs/security.md). Services then authenticate with NATS_USER/NATS_PASSWORD
# (deploy/overlays/static-users, the same Secret copied into namespace partkeeper); the
# provisioning Job (deploy/base/provision-job.yaml) as pk-provision. For many nodes, use JWT users
# minted from the scoped signing keys of deploy/nats/signing-keys.sh.
"""


def helm_accounts(node_token: str = SHIPPED_NODE) -> str:
    users = [ADMIN_USER, *(r.user for r in ROLES)]
    lines = [_HELM_HEADER.rstrip("\n"), "container:", "  env:"]
    for user in users:
        lines += [f"    {_env_name(user)}:", "      valueFrom:",
                  f"        secretKeyRef: {{name: partkeeper-nats-passwords, key: "
                  f"{user.removeprefix('pk-')}}}"]
    lines += ["config:", "  merge:", "    accounts:", f"      {ACCOUNT}:",
              "        jetstream:",
              # a size with a unit is written << ... >>, which the chart leaves unquoted
              *(f"          {k}: << {v} >>" if isinstance(v, str) else f"          {k}: {v}"
                for k, v in ACCOUNT_LIMITS.items()),
              "        users:",
              "        # Operators (`nats` CLI, `partkeeper status`): everything in the account.",
              f"        - user: {ADMIN_USER}",
              f"          password: << ${_env_name(ADMIN_USER)} >>",
              "          permissions:",
              "            publish:", '              allow: [">"]',
              "            subscribe:", '              allow: [">"]']
    for role in (r.render(node_token) for r in ROLES):
        lines += [f"        - user: {role.user}",
                  f"          password: << ${_env_name(role.user)} >>",
                  "          permissions:", "            publish:", "              allow:",
                  *_yaml_list(role.publish, "              ")]
        if role.deny_publish:
            lines += ["              deny:", *_yaml_list(role.deny_publish, "              ")]
        lines += ["            subscribe:", "              allow:",
                  *_yaml_list(role.subscribe, "              ")]
    return "\n".join(lines) + "\n"


TAG = "{{tag(node)}}"

_NSC_HEADER = """\
#!/bin/sh
# partkeeper's NATS roles as scoped signing keys of the PARTKEEPER account (NATS JWT mode), one
# per role, the node written as the template {{tag(node)}} so one set of roles serves every node.
# GENERATED from partkeeper/bus/permissions.py (python -m partkeeper.bus.permissions_render nsc);
# tests/reliability/test_shipped_permissions.py fails when this file and the table differ.
#
# Run once per account (after `nsc add operator`, `nsc add account PARTKEEPER`,
# `nsc edit account PARTKEEPER --js-enable 1`). Then per node and role, a user tagged with the
# node's subject token:
#   nsc add user --account PARTKEEPER --name <role>-<node> -K <role> --tag node:<token>
# and the provisioning identity once (its role names no node):
#   nsc add user --account PARTKEEPER --name provision -K provision
# docs/security.md says the rest.
set -eu
"""


def signing_keys() -> str:
    """`nsc edit signing-key` commands, one scoped key per role (`--role`)."""
    lines = [_NSC_HEADER.rstrip("\n"), "",
             "# the account's JetStream limits (docs/operations.md, Sizing)",
             f"nsc edit account {ACCOUNT} --js-disk-storage {ACCOUNT_LIMITS['max_file']} "
             f"--js-mem-storage {ACCOUNT_LIMITS['max_mem']} --js-streams "
             f"{ACCOUNT_LIMITS['max_streams']} --js-consumer {ACCOUNT_LIMITS['max_consumers']}"]
    for role in ROLES:
        rendered = role.render(TAG)
        lines += ["", f"# {role.user}: {role.summary}.",
                  f"nsc edit signing-key --account {ACCOUNT} --sk generate --role {role.name} \\"]
        args = [f"  --allow-pub '{s}'" for s in rendered.publish]
        args += [f"  --deny-pub '{s}'" for s in rendered.deny_publish]
        args += [f"  --allow-sub '{s}'" for s in rendered.subscribe]
        lines += [a + " \\" for a in args[:-1]] + [args[-1]]
    return "\n".join(lines) + "\n"


def parse_signing_keys(text: str) -> dict[str, Role]:
    """The roles a signing-keys script grants (for the test holding it to the table)."""
    found: dict[str, Role] = {}
    for block in text.split("nsc edit signing-key ")[1:]:
        name = block.split("--role ", 1)[1].split()[0]
        pub = tuple(p.split("'")[0] for p in block.split("--allow-pub '")[1:])
        sub = tuple(p.split("'")[0] for p in block.split("--allow-sub '")[1:])
        deny = tuple(p.split("'")[0] for p in block.split("--deny-pub '")[1:])
        if "--allow-pub-response" in block:
            raise ValueError(f"role {name} lets its responders reply to any subject")
        found[name] = Role(name, f"pk-{name}", "", pub, sub, deny)
    return found


def main(argv: list[str]) -> int:
    forms = {"conf": lambda: nats_conf(SHIPPED_NODE, dev_passwords()), "helm": helm_accounts,
             "nsc": signing_keys}
    if len(argv) != 1 or argv[0] not in forms:
        print(f"usage: python -m partkeeper.bus.permissions_render {{{'|'.join(forms)}}}",
              file=sys.stderr)
        return 2
    sys.stdout.write(forms[argv[0]]())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

__all__ = ["NODE", "dev_passwords", "helm_accounts", "nats_conf", "signing_keys"]
