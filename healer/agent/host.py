"""Rebooting the host the agent runs on, for the recovery ladder's ``reboot_node`` rung.

The command is the operator's (``agent.reboot_command``): healer never guesses how a host reboots. It
runs from an argument list, never a shell, with a short time limit: ``systemctl reboot`` returns as soon
as the shutdown is queued.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence

from healer import errors

TIMEOUT_S = 30.0


def rebooter(argv: Sequence[str]) -> Callable[[], str]:
    """A function that runs ``argv`` and says what it printed; raises PermanentError if it failed."""
    command = list(argv)

    def reboot() -> str:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise errors.PermanentError(f"{command[0]}: {e}") from e
        text = (done.stdout + done.stderr).strip()[-500:]
        if done.returncode != 0:
            raise errors.PermanentError(f"{' '.join(command)} exit {done.returncode}: {text}")
        return text or f"{' '.join(command)}: ok"

    return reboot
