"""The streams and KV buckets the contract names (schemas.names): provisioning, and the check.

`ensure_topology` creates or updates every stream and bucket; only `partkeeper provision` runs
it, as the one identity allowed to (docs/contract.md section 4, bus/permissions.py). The
services call `missing_topology`, which only looks (STREAM.INFO), and wait, not ready, while
anything is missing.

Every stream and bucket stream gets an explicit consumer limit: nats-server 2.15 gives a stream
1000 consumers unless it sets its own (and takes -1 for its default), and a fleet shares these
streams: PK_PODS carries two durables per node (reclaimer, GC), PK_PARTITIONS one, and each
bucket an ephemeral watch per node. `bench.fleet` stopped at 500 nodes on the default.

Every bucket is created with direct get (`allow_direct`): nats-py's KV then reads a key with
`$JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>`, the key in the subject, so a node's grant
names its own keys only. A bucket created before that (without it) is updated in place by the
next provision (docs/operations.md, "Direct get on existing buckets").

The server refuses what the code never does (docs/security.md, "What the server refuses"): every
stream and bucket denies purges and message deletes through the API and refuses rollup headers
(`Nats-Rollup` would let one message of one node empty a bucket of every node's keys), has a
size (`PK_STORE_BYTES` shared out by `names.StreamSpec.share`/`BucketSpec.share`) and a largest
message (`names.MAX_MSG_BYTES`); per-message TTLs stay off. A stream or bucket made by an earlier
version is brought to this configuration in place, its messages kept (docs/operations.md,
"Upgrading to refused purges and rollups").
"""

from __future__ import annotations

import asyncio
import logging

import nats.errors
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError

from partkeeper import backoff
from partkeeper.config import Config
from schemas import names

log = logging.getLogger(__name__)

MAX_CONSUMERS_PER_STREAM = 10_000  # room for 5,000 nodes (docs/operations.md)
REQUIRED: tuple[str, ...] = (tuple(s.name for s in names.STREAMS)
                             + tuple(f"KV_{b.name}" for b in names.BUCKETS))


def guarded(config: api.StreamConfig, max_bytes: int) -> api.StreamConfig:
    """`config` with what the server must refuse: purges, deletes, rollups, oversized messages
    and growth past `max_bytes`."""
    config.deny_purge = True
    config.deny_delete = True
    config.allow_rollup_hdrs = False
    config.max_msg_size = names.MAX_MSG_BYTES
    config.max_bytes = max_bytes
    config.max_consumers = MAX_CONSUMERS_PER_STREAM
    return config


def _is_guarded(config: api.StreamConfig, max_bytes: int) -> bool:
    return (bool(config.deny_purge) and bool(config.deny_delete)
            and not config.allow_rollup_hdrs and config.max_msg_size == names.MAX_MSG_BYTES
            and config.max_bytes == max_bytes
            and config.max_consumers == MAX_CONSUMERS_PER_STREAM and bool(config.allow_direct))


async def ensure_topology(js: JetStreamContext, *, replicas: int = 1,
                          store_bytes: int = names.STORE_BYTES) -> None:
    """Create or update every stream and bucket (`partkeeper provision`; tests). Idempotent.

    `store_bytes` is what all of them together may hold (`PK_STORE_BYTES`)."""
    for spec in names.STREAMS:
        config = guarded(api.StreamConfig(
            name=spec.name,
            subjects=list(spec.subjects),
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            max_age=spec.max_age_seconds,
            duplicate_window=spec.duplicate_window_seconds,
            num_replicas=replicas,
            # Full, a stream drops its oldest entries: a node filling it delays no one's
            # publishes, and what a lagging consumer loses the reconcile passes find again.
            discard=api.DiscardPolicy.OLD,
        ), names.share_of(store_bytes, spec.share))
        try:
            await js.stream_info(spec.name)
        except NotFoundError:
            try:
                await js.add_stream(config)
            except BadRequestError:
                # Another provisioner created it between our lookup and our create.
                await js.stream_info(spec.name)
        else:
            await js.update_stream(config)
    for bucket in names.BUCKETS:
        stream = f"KV_{bucket.name}"
        max_bytes = names.share_of(store_bytes, bucket.share)
        try:
            await js.stream_info(stream)
        except NotFoundError:
            try:
                await js.add_stream(_bucket_config(bucket, replicas, max_bytes))
            except BadRequestError:
                await js.stream_info(stream)  # another provisioner created it meanwhile
        await _bucket_stream(js, stream, max_bytes)


def _bucket_config(bucket: names.BucketSpec, replicas: int, max_bytes: int) -> api.StreamConfig:
    """A bucket's stream as nats-py's `create_key_value` lays it out (`KV_<bucket>`,
    `$KV.<bucket>.>`, history as messages per subject, discard-new, deletes through the API
    denied), except what it allows and nothing of ours uses: rollups (KV purge) and per-message
    TTLs (`Nats-TTL`), which the server cannot turn off again once a stream allows them."""
    return guarded(api.StreamConfig(
        name=f"KV_{bucket.name}",
        description=bucket.description,
        subjects=[f"$KV.{bucket.name}.>"],
        allow_direct=True,
        discard=api.DiscardPolicy.NEW,
        duplicate_window=120.0,
        max_msgs=-1,
        max_msgs_per_subject=bucket.history,
        num_replicas=replicas,
        storage=api.StorageType.FILE,
    ), max_bytes)


async def _bucket_stream(js: JetStreamContext, stream: str, max_bytes: int) -> None:
    """What the KV API does not set, or an older version did not: refused purges, deletes and
    rollups (nats-py creates buckets allowing rollups, which KV purges use, and nothing of ours
    purges a key), the sizes, the consumer limit and direct get. Updating a bucket's stream in
    place keeps its messages (the migration of a bucket an earlier version created). A full
    bucket refuses new writes (KV's discard-new): dropping its oldest entries would drop other
    nodes' keys."""
    config = (await js.stream_info(stream)).config
    if not _is_guarded(config, max_bytes):
        config.allow_direct = True
        await js.update_stream(guarded(config, max_bytes))


async def missing_topology(js: JetStreamContext) -> list[str]:
    """The contract's streams (and bucket streams) that do not exist, looking only.

    Raises on anything but "not found" (JetStream not answering, no permission): that is not an
    answer about existence, and the caller retries it rather than reading it as missing."""
    missing: list[str] = []
    for stream in REQUIRED:
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            missing.append(stream)
            continue
        if stream.startswith("KV_") and not info.config.allow_direct:
            missing.append(f"{stream} (without direct get)")
        elif info.config.allow_rollup_hdrs or not info.config.deny_purge:
            # an earlier version's: a node's rollup could empty it; provisioning updates it
            missing.append(f"{stream} (allowing purges or rollups)")
    return missing


async def provision(config: Config, *, deadline: float) -> list[str]:
    """`partkeeper provision`: connect as the provisioning identity and create or update every
    stream and bucket with `PK_STREAM_REPLICAS` replicas, retrying (backoff) while the servers or
    JetStream cannot answer yet (a cluster electing its leaders), until `deadline` (monotonic).
    Returns the names provisioned; raises ProvisionError saying what failed last."""
    from partkeeper.bus.connection import connect  # connection imports the permission table
    from partkeeper.bus.permissions import PROVISION

    loop = asyncio.get_running_loop()
    try:
        nc = await asyncio.wait_for(connect(config, PROVISION),
                                    max(0.1, deadline - loop.time()))
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        raise ProvisionError(f"no NATS server at {','.join(config.nats_urls)} accepted the "
                             f"connection: {exc or type(exc).__name__}") from exc
    try:
        await backoff.retry(
            "provisioning",
            lambda: ensure_topology(nc.jetstream(), replicas=config.stream_replicas,
                                    store_bytes=config.store_bytes),
            schedule=backoff.Schedule(0.5, 5.0), deadline=deadline,
        )
    except Exception as exc:
        raise ProvisionError(f"creating the streams and buckets failed: "
                             f"{exc or type(exc).__name__}") from exc
    finally:
        await nc.close()
    return list(REQUIRED)


class ProvisionError(Exception):
    """The streams and buckets could not be provisioned; the message says why."""
