"""A TCP proxy between a service and nats-server that has the network's bad days on demand.

`FaultProxy(port)` listens on a free loopback port (`url`) and forwards every connection to
`127.0.0.1:<port>`. Faults apply to the connections open now and to those accepted later:

- `pause()`: bytes are held (not read), so TCP backpressure builds; `resume()` lets them through.
- `delay(seconds)`: every chunk waits that long before it is forwarded (a slow network).
- `black_hole(half_open=False)`: bytes are read and thrown away in both directions; the
  connections stay open and new ones are accepted, so neither end learns anything from TCP. With
  `half_open` a side that gives up and closes is not told to the other: the server keeps its end
  of a connection whose client is long gone, as after a silent route loss.
- `drop()`: every connection open now is reset (RST), as when a middlebox forgets them.
- `heal()`: no fault; forwarding as normal from now on (bytes thrown away stay lost).

Every method is called from the test's event loop; the proxy runs there too.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass, field

CHUNK = 65536


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    pumps: list[asyncio.Task[None]] = field(default_factory=list)

    def abort(self) -> None:
        for writer in (self.client, self.server):
            transport = writer.transport
            if not transport.is_closing():
                transport.abort()


class FaultProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.accepted = 0
        self._mode = "pass"
        self._half_open = False
        self._delay = 0.0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.abort()
        pumps = [p for link in list(self._links) for p in link.pumps]
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # --- faults ----------------------------------------------------------------------------

    def pause(self) -> None:
        self._mode = "pause"
        self._flowing.clear()

    def resume(self) -> None:
        self.heal()

    def delay(self, seconds: float) -> None:
        self._delay = seconds

    def black_hole(self, *, half_open: bool = False) -> None:
        self._mode = "black-hole"
        self._half_open = half_open
        self._flowing.set()

    def drop(self) -> None:
        for link in list(self._links):
            link.abort()

    def heal(self) -> None:
        self._mode = "pass"
        self._half_open = False
        self._delay = 0.0
        self._flowing.set()

    @property
    def connections(self) -> int:
        return len(self._links)

    # --- forwarding ------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(writer)
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        link.pumps = [
            asyncio.create_task(self._pump(link, reader, up_writer, writer)),
            asyncio.create_task(self._pump(link, up_reader, writer, up_writer)),
        ]
        await asyncio.gather(*link.pumps, return_exceptions=True)
        self._links.discard(link)

    async def _pump(
        self, link: _Link, source: asyncio.StreamReader, sink: asyncio.StreamWriter,
        source_writer: asyncio.StreamWriter,
    ) -> None:
        try:
            while True:
                await self._flowing.wait()
                data = await source.read(CHUNK)
                if not data:
                    break
                await self._flowing.wait()
                if self._mode == "black-hole":
                    continue
                if self._delay:
                    await asyncio.sleep(self._delay)
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if self._mode == "black-hole" and self._half_open:
                _close(source_writer)  # the side that left; the other is never told
            else:
                _close(source_writer)
                _close(sink)


def _close(writer: asyncio.StreamWriter) -> None:
    if not writer.transport.is_closing():
        writer.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
