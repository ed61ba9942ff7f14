"""Structured JSON logs: one line per decision, with the Pod UID, card and claim id as fields.

A line written inside a span carries its `trace_id` and `span_id`, so a log line leads to its
trace in Jaeger and back.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

from partkeeper.telemetry.tracing import current_ids

_RESERVED = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                line[key] = value
        ids = current_ids()
        if ids is not None:
            line["trace_id"], line["span_id"] = ids
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def setup(service: str, level: str | None = None) -> None:
    """JSON lines on stderr; PK_LOG_LEVEL (default info) sets the level."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel((level or os.environ.get("PK_LOG_LEVEL", "info")).upper())
    logging.getLogger("nats").setLevel(logging.WARNING)
    logging.Formatter.converter = time.gmtime


def decision(logger: logging.Logger, message: str, **fields: Any) -> None:
    """Log one decision with its identifying fields (pod_uid, card, claim_id, ...)."""
    logger.info(message, extra={k: v for k, v in fields.items() if v is not None})
