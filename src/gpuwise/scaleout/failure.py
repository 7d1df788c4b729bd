"""One line for a failed torchrun job, from its stderr: which rank failed first and how.

torchrun's elastic agent ends a failed job with a `ChildFailedError` block whose "Root Cause (first
observed failure)" names the rank, its exit code and, for a signal, "Signal 9 (SIGKILL) received by PID
N"; the other ranks' tracebacks (gloo/NCCL "Connection closed by peer") are consequences. A rank that
raised prints `[rankN]: Traceback ...` lines ending in the exception.
"""

from __future__ import annotations

import re

_ROOT = re.compile(r"Root Cause \(first observed failure\):(.*?)(?:={10,}|\Z)", re.S)
_RANK = re.compile(r"rank\s*:\s*(\d+)")
_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
_SIGNAL = re.compile(r"Signal (\d+) \((SIG\w+)\)")


def summarize_failure(log: str) -> str | None:
    """'rank 1 (pid 2448) was killed by signal 9 (SIGKILL)' or 'rank 0 raised RuntimeError: ...'; None
    when the log says nothing recognisable."""
    root = _ROOT.search(log)
    if root:
        block = root.group(1)
        rank = _RANK.search(block)
        code = _EXIT.search(block)
        sig = _SIGNAL.search(block)
        who = f"rank {rank.group(1)}" if rank else "a rank"
        if code:
            who += f" (pid {code.group(2)})"
        if sig:
            hint = " (the kernel's OOM killer or a preemption, most often)" if sig.group(2) == "SIGKILL" else ""
            return f"{who} was killed by signal {sig.group(1)} ({sig.group(2)}){hint}; the other ranks were stopped"
        error = _rank_error(log, rank.group(1) if rank else None)
        if error:
            return f"{who} raised {error}"
        if code:
            return f"{who} exited with code {code.group(1)}"
    error = _rank_error(log, None)
    return f"a rank raised {error}" if error else None


def _rank_error(log: str, rank: str | None) -> str | None:
    """The last exception line a rank printed (`[rankN]: SomeError: ...`)."""
    prefix = re.escape(f"[rank{rank}]: ") if rank is not None else r"\[rank\d+\]: "
    found = re.findall(prefix + r"(\w+(?:Error|Exception|Interrupt)\b.*)", log)
    return found[-1].strip()[:300] if found else None
