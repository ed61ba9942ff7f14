"""The env file `partkeeper up` writes for other shells (`. DIR/env`): sourced in a shell with no
virtual environment active, it sets the stack's variables and finds the `partkeeper` it names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from partkeeper_sim.stack.layout import write_env


def test_sourcing_the_env_file_puts_the_command_first_on_path(tmp_path: Path) -> None:
    scripts = Path(sys.executable).parent
    env_file = tmp_path / "env"
    write_env(env_file, {"NATS_URL": "nats://127.0.0.1:4222", "NATS_PASSWORD": "it's"},
              path_first=scripts)
    shown = subprocess.run(
        ["bash", "-c", f'. {env_file} && command -v partkeeper && printf "%s\\n" '
                       '"$NATS_URL" "$NATS_PASSWORD" "$PATH"'],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [str(scripts / "partkeeper"), "nats://127.0.0.1:4222",
                                         "it's", f"{scripts}:/usr/bin:/bin"]
    assert env_file.stat().st_mode & 0o777 == 0o600
