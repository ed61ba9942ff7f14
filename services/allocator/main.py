"""The allocator service: which mode runs (`PK_MODE`), and the container entrypoint.

Device-plugin mode (`deviceplugin/main.py`) and DRA mode (`dra/main.py`) run over one core
(`core/`); this module alone knows both.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from nats.aio.client import Client

from partkeeper import runtime
from partkeeper.config import Config
from services.allocator.core.options import Options
from services.allocator.deviceplugin import main as deviceplugin_main
from services.allocator.dra import leftover
from services.allocator.dra import main as dra_main


async def serve(
    config: Config,
    nc: Client,
    *,
    ready: asyncio.Event | None = None,
    options: Options | None = None,
) -> None:
    """Run the allocator until cancelled. `ready` is set once kubelet's sockets serve (with
    correct health) and registration with kubelet has started."""
    options = room_waited(config, options or Options())
    if config.mode == "dra":
        await dra_main.serve(config, nc, options, ready)
    else:
        # A node moved back from DRA: the DRA claims still in the store end as in DRA mode
        # (dra/leftover.py); the device plugin runs it without knowing DRA mode.
        await deviceplugin_main.serve(config, nc, options, ready,
                                      also=("DRA claims from DRA mode", leftover.run))


def room_waited(config: Config, options: Options) -> Options:
    """`PK_ROOM_WAIT_SECONDS`, when set, over the options' room wait."""
    if config.room_wait_seconds is None:
        return options
    return replace(options, room_wait_seconds=config.room_wait_seconds)


def main() -> int:
    return runtime.run("allocator", serve)
