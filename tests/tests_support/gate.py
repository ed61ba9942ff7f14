"""A gate a test opens: an injected `sleep` that parks the caller until the test lets it go.

The simulated driver spends an operation's latency in its `sleep` (outside its file lock, as
hardware would). A test that needs "while the create is in flight" gives the driver a gate's
`sleep` and a non-zero latency: the operation parks in the gate, the test does what it needs
meanwhile, then opens the gate. Deterministic, where a latency long enough to act within is a
timing window.
"""

from __future__ import annotations

import threading

DEADLINE = 30.0  # how long a parked call waits for the test before it fails


class Gate:
    """Parks every caller of `sleep` until `open()`; records the delays it was asked for."""

    def __init__(self, deadline: float = DEADLINE) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.delays: list[float] = []
        self._deadline = deadline

    def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.entered.set()
        if not self.release.wait(self._deadline):
            raise TimeoutError("the test never opened the gate")

    def open(self) -> None:
        self.release.set()
