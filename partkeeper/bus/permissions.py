"""Who may say what on the bus: the one table of NATS permissions, per role.

Every shipped form of the permissions is rendered from `ROLES` (permissions_render.py):
compose/nats/nats.conf, deploy/nats/accounts.yaml (Helm), deploy/nats/signing-keys.sh (the JWT
roles as scoped signing-key templates) and the embedded stack's configuration (`partkeeper up`,
the test rig). tests/reliability/test_shipped_permissions.py fails when a shipped file is not what
the table renders, and test_access_control.py holds a real nats-server to the table.

A subject template names the node as `{node}`: the node's subject token (schemas.names
.encode_token) in a static configuration, `{{tag(node)}}` in a signing-key template. Nothing here
grants creating, updating, purging or deleting a stream or bucket except the `provision` role
(`partkeeper provision`, docs/contract.md section 4): the services only look (STREAM.INFO).
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.names import (
    BUCKET_CAPACITY,
    BUCKET_CLAIMS,
    BUCKET_PODS,
    BUCKETS,
    GC_SCOPE,
    NODE_SCOPE,
    SERVICE_ALLOCATOR,
    SERVICE_RECLAIMER,
    SERVICE_WATCHER,
    STREAM_PARTITIONS,
    STREAM_PODS,
    STREAMS,
)

NODE = "{node}"
# The provisioning identity serves no node; '_' never stands for itself in a node token, so no
# node's inbox (`_INBOX.<node token>.<service>`) can fall under this one.
CLUSTER_SCOPE = "_cluster"
PROVISION = "provision"
# Operators' tools (`partkeeper status`, the demo, the `nats` CLI with `--inbox-prefix`) ask a
# node's services from `_INBOX.<node token>.admin` (DESIGN.md section 4, pk-admin).
ADMIN = "admin"
SERVICES = ("watcher", "allocator", "reclaimer", "gc")

TOPOLOGY: tuple[str, ...] = tuple(s.name for s in STREAMS) + tuple(f"KV_{b.name}" for b in BUCKETS)


def inbox_prefix(service: str, node_token: str | None) -> str:
    """The connection's private inbox prefix (nats-py `inbox_prefix`), without a trailing dot."""
    return f"_INBOX.{node_token or CLUSTER_SCOPE}.{service}"


@dataclass(frozen=True, slots=True)
class Role:
    """One NATS user's grants; subjects are templates naming the node as `{node}`."""

    name: str  # the service, or "provision"
    user: str  # the static user name (pk-<name>)
    summary: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    deny_publish: tuple[str, ...] = ()  # carved out of `publish` (NATS checks deny after allow)

    def render(self, node_token: str) -> Role:
        """The same role with `{node}` replaced (a static configuration for one node)."""
        return Role(self.name, self.user, self.summary,
                    tuple(s.replace(NODE, node_token) for s in self.publish),
                    tuple(s.replace(NODE, node_token) for s in self.subscribe),
                    tuple(s.replace(NODE, node_token) for s in self.deny_publish))


def _look() -> tuple[str, ...]:
    """STREAM.INFO on the contract's streams and bucket streams: the services' readiness check."""
    return tuple(f"$JS.API.STREAM.INFO.{name}" for name in TOPOLOGY)


def _durable_name(service: str, stream: str) -> str:
    # schemas.names.durable_name with the node left as a template (it would escape the braces)
    return f"{service}-{stream.lower()}-{NODE}"


def _durable(service: str, stream: str, filter_subject: str) -> tuple[str, ...]:
    """A durable pull consumer of this node: look it up, create it, pull, ack."""
    durable = _durable_name(service, stream)
    return (
        f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.{filter_subject}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    )


def _read(bucket: str, key: str = f"{NODE}.>") -> tuple[str, ...]:
    """Direct get of this node's keys only (the bucket is created with allow_direct)."""
    return (f"$JS.API.DIRECT.GET.KV_{bucket}.$KV.{bucket}.{key}",)


def _not_theirs(stream: str, durable: str) -> str:
    """A consumer create naming another service's durable: the server would take it as an
    update of that consumer (nats-server consumer.go, addConsumerWithAssignment: an existing
    name with the create-or-update action), which a watch grant's `*` name would allow."""
    return f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.>"


def _watch(stream: str, subjects: str) -> tuple[str, ...]:
    """Ordered watches of this node's `subjects` (bus/ordered.py): each consumer is created under
    a fresh name with its filter in the create subject, and the server refuses a body whose
    filter differs from the subject's, so `*` (any name) reads no other node's subjects. No
    CONSUMER.DELETE or INFO: the watch never asks either, and a consumer it leaves is removed by
    the server after its inactive threshold; a delete grant would need the same `*` and would
    let the service delete other nodes' consumers. Flow control is answered on
    `$JS.FC.<stream>.<consumer>.<token>` (nats-server consumer.go), as the reply of a
    flow-control message or named in a stalled heartbeat's header: hence this stream's FC
    subjects (no service has `allow_responses`)."""
    return (f"$JS.API.CONSUMER.CREATE.{stream}.*.{subjects}", f"$JS.FC.{stream}.>")


def _serves(micro: str) -> tuple[str, ...]:
    return ("$SRV.PING", "$SRV.INFO", "$SRV.STATS", f"$SRV.*.{micro}", f"$SRV.*.{micro}.*")


def _inbox(service: str) -> tuple[str, ...]:
    return (f"{inbox_prefix(service, NODE)}.>",)


def _answers(*askers: str) -> tuple[str, ...]:
    """Publish grants on the private inboxes of this node's services that may ask what the role
    answers, and on the operators' inbox: replies go there and nowhere else. `allow_responses`
    would let a responder publish on whatever reply subject a request names, a claim key or a
    stream subject included, and `rpc.serve` drops such a request too (`reply_inboxes`)."""
    return tuple(f"{inbox_prefix(asker, NODE)}.>" for asker in (*askers, ADMIN))


WATCHER = Role(
    "watcher", "pk-watcher",
    "the only publisher of Pod events; answers pods.get, pods.states and pods.pending; reads the "
    "partition "
    "audit log (its Event recorder's durable) and dead-letters there",
    publish=(
        f"pk.pods.{NODE}.*", f"pk.dlq.{NODE}.watcher-events", f"$KV.{BUCKET_PODS}.{NODE}.>",
        *_look(), *_read(BUCKET_PODS),
        *_durable("watcher-events", STREAM_PARTITIONS, f"pk.parts.{NODE}.*"),
        *_answers("allocator", "reclaimer", "gc"),
    ),
    subscribe=(*_inbox("watcher"), f"pk.{NODE}.pods.get", f"pk.{NODE}.pods.states",
               f"pk.{NODE}.pods.pending", *_serves(SERVICE_WATCHER)),
)

ALLOCATOR = Role(
    "allocator", "pk-allocator",
    "claims (write-ahead) and capacity; asks pods.get, pods.pending and reclaim.now; answers "
    "claims.query; publishes claim transitions of this node's cards",
    publish=(
        f"pk.parts.{NODE}.*",
        f"pk.{NODE}.pods.get", f"pk.{NODE}.pods.pending", f"pk.{NODE}.reclaim.now",
        f"$KV.{BUCKET_CLAIMS}.{NODE}.>", f"$KV.{BUCKET_CAPACITY}.{NODE}",
        *_look(), *_read(BUCKET_CLAIMS), *_read(BUCKET_PODS),
        *_watch(f"KV_{BUCKET_CLAIMS}", f"$KV.{BUCKET_CLAIMS}.{NODE}.>"),
        *_watch(f"KV_{BUCKET_PODS}", f"$KV.{BUCKET_PODS}.{NODE}.>"),
        # following the audit log (removals.py)
        *_watch(STREAM_PARTITIONS, f"pk.parts.{NODE}.>"),
        *_answers("gc"),
    ),
    subscribe=(*_inbox("allocator"), f"pk.{NODE}.claims.query", *_serves(SERVICE_ALLOCATOR)),
    # its PK_PARTITIONS watch grant covers the watcher's durable there (same node, same subjects)
    deny_publish=(_not_theirs(STREAM_PARTITIONS,
                              _durable_name("watcher-events", STREAM_PARTITIONS)),
                  f"pk.parts.{NODE}.{GC_SCOPE}"),
)

RECLAIMER = Role(
    "reclaimer", "pk-reclaimer",
    "consumes this node's Pod events (its durable), releases and removes claims, asks pods.get, "
    "answers reclaim.now, publishes claim transitions and foreign instances of this node's "
    "cards, dead-letters under its own name",
    publish=(
        f"pk.parts.{NODE}.*", f"pk.dlq.{NODE}.reclaimer", f"pk.{NODE}.pods.get",
        f"$KV.{BUCKET_CLAIMS}.{NODE}.>",
        *_look(), *_read(BUCKET_CLAIMS),
        *_durable("reclaimer", STREAM_PODS, f"pk.pods.{NODE}.*"),
        *_answers("allocator"),
    ),
    subscribe=(*_inbox("reclaimer"), f"pk.{NODE}.reclaim.now", *_serves(SERVICE_RECLAIMER)),
    # card subjects only: the node-scope subjects are the allocator's and the GC's
    deny_publish=(f"pk.parts.{NODE}.{NODE_SCOPE}", f"pk.parts.{NODE}.{GC_SCOPE}"),
)

GC = Role(
    "gc", "pk-gc",
    "consumes this node's Pod events (its durable), asks pods.get, pods.states and claims.query, "
    "announces "
    "collected working directories on its own audit subject only; it cannot publish Pod "
    "events, claim transitions of a card, the allocator's refusals, or call reclaim.now",
    publish=(
        f"pk.parts.{NODE}.{GC_SCOPE}", f"pk.dlq.{NODE}.gc",
        f"pk.{NODE}.pods.get", f"pk.{NODE}.pods.states", f"pk.{NODE}.claims.query",
        *_look(), *_durable("gc", STREAM_PODS, f"pk.pods.{NODE}.*"),
    ),
    subscribe=_inbox("gc"),
)

PROVISIONER = Role(
    PROVISION, "pk-provision",
    "`partkeeper provision`: creates and updates the streams and buckets; nothing else",
    publish=tuple(f"$JS.API.STREAM.{verb}.{name}" for name in TOPOLOGY
                  for verb in ("INFO", "CREATE", "UPDATE")),
    subscribe=(f"{inbox_prefix(PROVISION, None)}.>",),
)

ROLES: tuple[Role, ...] = (WATCHER, ALLOCATOR, RECLAIMER, GC, PROVISIONER)
BY_NAME = {role.name: role for role in ROLES}
ADMIN_USER = "pk-admin"  # operators, `partkeeper status`, the demo and tests: the whole account


def reply_inboxes(request_subject: str) -> tuple[str, ...]:
    """The reply-subject prefixes a responder on `request_subject` (`pk.<node token>.<verb>`)
    answers: the private inboxes of the node's services whose role may publish the request, and
    the operators' `_INBOX.<node token>.admin.`. Empty for a subject no role asks."""
    parts = request_subject.split(".")
    if len(parts) < 3 or parts[0] != "pk":
        return ()
    token = parts[1]
    askers = [role.name for role in ROLES if role.name != PROVISION
              and request_subject in role.render(token).publish]
    return tuple(f"{inbox_prefix(asker, token)}." for asker in (*askers, ADMIN))
