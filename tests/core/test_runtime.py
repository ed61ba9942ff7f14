"""A service process stops on SIGTERM even while NATS has never answered."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from partkeeper.stack.natsserver import free_port


def test_sigterm_while_nats_is_unreachable_exits_cleanly() -> None:
    env = {
        **os.environ, "PK_NODE_NAME": "n", "PK_METRICS_PORT": "0",
        "NATS_URL": f"nats://127.0.0.1:{free_port()}",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.gc"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the first failed attempt proves it is waiting on NATS
            if "nats connection error" in line:
                break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
