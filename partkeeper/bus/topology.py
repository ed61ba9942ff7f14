"""Idempotent creation of the streams and KV buckets the contract names (schemas.names).

Every stream and bucket stream gets an explicit consumer limit: nats-server 2.15 gives a stream
1000 consumers unless it sets its own (and takes -1 for its default), and a fleet shares these
streams: PK_PODS carries two durables per node (reclaimer, GC), PK_PARTITIONS one, and each
bucket an ephemeral watch per node. `bench.fleet` stopped at 500 nodes on the default.
"""

from __future__ import annotations

from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError

from schemas import names

MAX_CONSUMERS_PER_STREAM = 10_000  # room for 5,000 nodes (docs/operations.md)


async def ensure_topology(js: JetStreamContext, *, replicas: int = 1) -> None:
    """Create or update every stream and bucket. Safe to call from every service at start."""
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
                # Another service created it between our lookup and our create.
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
                )
            except BadRequestError:
                await js.key_value(bucket.name)  # another service created it meanwhile
        await _consumer_limit(js, f"KV_{bucket.name}")


async def _consumer_limit(js: JetStreamContext, stream: str) -> None:
    """A bucket's stream takes the same consumer limit (the KV API does not set one)."""
    config = (await js.stream_info(stream)).config
    if config.max_consumers != MAX_CONSUMERS_PER_STREAM:
        config.max_consumers = MAX_CONSUMERS_PER_STREAM
        await js.update_stream(config)
