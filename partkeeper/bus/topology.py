"""Idempotent creation of the streams and KV buckets the contract names (schemas.names)."""

from __future__ import annotations

from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError

from schemas import names


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
        await js.create_key_value(
            bucket=bucket.name,
            history=bucket.history,
            description=bucket.description,
            replicas=replicas,
            storage=api.StorageType.FILE,
        )
