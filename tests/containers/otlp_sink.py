"""The OTLP receiver standing in Jaeger's place in the compose test (compose.stand-ins.yml).

It serves `TraceService/Export` over gRPC on 0.0.0.0:4317, the port Jaeger's all-in-one collector
listens on, with tests_support.otlp_receiver (the receiver the process-level trace tests use), and
appends every span it is sent as one JSON line to $OTLP_SINK_FILE, flushed at once, so that the
test reads what arrived from outside the container.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
from typing import Any

import grpc.aio
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests_support.otlp_receiver import OtlpReceiver


class Sink(OtlpReceiver):
    def __init__(self, path: str) -> None:
        super().__init__(host="0.0.0.0")
        self._out = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the sink's life

    async def Export(self, request: trace_service_pb2.ExportTraceServiceRequest,
                     context: grpc.aio.ServicerContext,
                     ) -> trace_service_pb2.ExportTraceServiceResponse:
        before = len(self.spans)
        response = await super().Export(request, context)
        for span in self.spans[before:]:
            self._out.write(json.dumps(dataclasses.asdict(span)) + "\n")
        self._out.flush()
        return response


async def serve(path: str, port: int) -> None:
    sink = Sink(path)
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    server.add_insecure_port(f"0.0.0.0:{port}")
    await server.start()
    print(f"otlp sink: listening on :{port}, writing {path}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(grace=1)


def main() -> None:
    settings: dict[str, Any] = {"path": os.environ.get("OTLP_SINK_FILE", "/out/spans.jsonl"),
                                "port": int(os.environ.get("OTLP_SINK_PORT", "4317"))}
    asyncio.run(serve(**settings))


if __name__ == "__main__":
    main()
