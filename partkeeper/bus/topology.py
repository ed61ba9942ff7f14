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
"""

from __future__ import annotations

import asyncio
import logging

import nats.errors
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError

from partkeeper import backoff
from partkeeper.config import Config
from schemas import names

log = logging.getLogger(__name__)

MAX_CONSUMERS_PER_STREAM = 10_000  # room for 5,000 nodes (docs/operations.md)
REQUIRED: tuple[str, ...] = (tuple(s.name for s in names.STREAMS)
                             + tuple(f"KV_{b.name}" for b in names.BUCKETS))


async def ensure_topology(js: JetStreamContext, *, replicas: int = 1) -> None:
    """Create or update every stream and bucket (`partkeeper provision`; tests). Idempotent."""
    for spec in names.STREAMS:
        config = api.StreamConfig(
            name=spec.name,
            subjects=list(spec.subjects),
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            max_age=spec.max_age_seconds,
            duplicate_window=spec.duplicate_window_seconds,
            num_replicas=replicas,
            max_consumers=MAX_CONSUMERS_PER_STREAM,
        )
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
        try:
            await js.key_value(bucket.name)
        except BucketNotFoundError:
            try:
                await js.create_key_value(
                    bucket=bucket.name,
                    history=bucket.history,
                    description=bucket.description,
                    replicas=replicas,
                    storage=api.StorageType.FILE,
                    direct=True,
                )
            except BadRequestError:
                await js.key_value(bucket.name)  # another provisioner created it meanwhile
        await _bucket_stream(js, f"KV_{bucket.name}")


async def _bucket_stream(js: JetStreamContext, stream: str) -> None:
    """What the KV API does not set, or an older version did not: the consumer limit and
    direct get. Updating a bucket's stream in place keeps its messages (migration of a bucket
    created without direct get)."""
    config = (await js.stream_info(stream)).config
    if config.max_consumers != MAX_CONSUMERS_PER_STREAM or not config.allow_direct:
        config.max_consumers = MAX_CONSUMERS_PER_STREAM
        config.allow_direct = True
        await js.update_stream(config)


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
            lambda: ensure_topology(nc.jetstream(), replicas=config.stream_replicas),
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
