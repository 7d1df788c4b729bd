"""Waiting on a command gpuwise started (run, launch/train/scale's torchrun, watch)."""

from __future__ import annotations

import signal
import subprocess


def shell_exit_code(returncode: int) -> int:
    """A child killed by signal N exits as the shell reports it: 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def wait_forwarding_sigint(proc: subprocess.Popen) -> int:
    """Wait for `proc`; a Ctrl-C is passed on as SIGINT so it can shut down, and waited for again."""
    while True:
        try:
            return shell_exit_code(proc.wait())
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
