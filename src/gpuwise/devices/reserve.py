"""GPU reservations, so that jobs started at the same moment never get the same GPU.

A reservation is a small JSON file per GPU UUID in a lock folder shared by every gpuwise process on
the machine (`GPUWISE_LOCK_DIR`, default `/tmp/gpuwise-locks`). Choosing and writing happen under
one `flock` on the folder's `.lock`, so two pickers cannot both see a GPU as free. A holder is either
a live process (held for that process's life; the pid and its start time guard against pid reuse) or
a lease that expires at a given time (for `gpuwise pick` printing a value to a shell). Holders whose
process died or whose lease ran out are removed whenever the folder is read.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import psutil

ENV = "GPUWISE_LOCK_DIR"
DEFAULT_DIR = os.path.join(tempfile.gettempdir(), "gpuwise-locks")


def lock_dir() -> str:
    path = os.environ.get(ENV) or DEFAULT_DIR
    if not os.path.isdir(path):
        os.makedirs(path, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(path, 0o1777)  # shared by all users, like /tmp
    return path


@contextlib.contextmanager
def folder_lock() -> Iterator[str]:
    """Hold the folder's exclusive lock: the critical section for read-holders / choose / write."""
    path = lock_dir()
    fd = os.open(os.path.join(path, ".lock"), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def _alive(holder: dict, now: float) -> bool:
    expires = holder.get("expires_at")
    if expires is not None and now >= expires:
        return False
    pid = holder.get("pid")
    if pid is None:
        return expires is not None
    if holder.get("host") not in (None, socket.gethostname()):
        return True  # a shared /tmp across hosts: we cannot see that process; trust it
    started = _start_time(pid)
    return started is not None and abs(started - holder.get("pid_start", started)) < 1.0


def _holder_path(folder: str, uuid: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in uuid)
    return os.path.join(folder, safe + ".json")


def live_holders(folder: str) -> dict[str, dict]:
    """UUID -> holder, for live holders; stale holder files are deleted. Call under `folder_lock`."""
    now = time.time()
    holders = {}
    for name in os.listdir(folder):
        if not name.endswith(".json"):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path) as fh:
                holder = json.load(fh)
        except (OSError, json.JSONDecodeError):
            continue
        if _alive(holder, now):
            holders[holder["uuid"]] = holder
        else:
            with contextlib.suppress(OSError):
                os.remove(path)
    return holders


def held_by_others(holders: dict[str, dict]) -> set[str]:
    """UUIDs held by anyone but this process's ancestors.

    A job started by `gpuwise run -- python train.py` may itself call `gpuwise.pick()`: the GPUs its
    parent reserved are its own, not another job's. This process's own earlier picks still count, so
    a launcher picking for several workers in turn gives each a different GPU."""
    mine: set[int] = set()
    try:
        mine.update(p.pid for p in psutil.Process().parents())
    except (psutil.Error, OSError):
        pass
    host = socket.gethostname()
    return {u for u, h in holders.items() if not (h.get("pid") in mine and h.get("host") in (None, host))}


def reserved_uuids() -> set[str]:
    """UUIDs reserved by other live jobs."""
    with folder_lock() as folder:
        return held_by_others(live_holders(folder))


@dataclass
class Reservation:
    """GPUs held by this process (or a lease). `release()` frees them; it also runs at interpreter exit."""

    uuids: list[str]
    folder: str
    pid: int | None
    expires_at: float | None
    released: bool = field(default=False)

    def release(self) -> None:
        if self.released:
            return
        with folder_lock():
            for uuid in self.uuids:
                path = _holder_path(self.folder, uuid)
                try:
                    with open(path) as fh:
                        holder = json.load(fh)
                except (OSError, json.JSONDecodeError):
                    continue
                if holder.get("pid") == self.pid and holder.get("expires_at") == self.expires_at:
                    with contextlib.suppress(OSError):
                        os.remove(path)
        self.released = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def write_holders(folder: str, uuids: list[str], *, pid: int | None, lease_s: float | None, command: str = "") -> Reservation:
    """Record holders for `uuids` (call under `folder_lock`, after checking they are free)."""
    expires = time.time() + lease_s if lease_s is not None else None
    for uuid in uuids:
        holder = {"uuid": uuid, "pid": pid, "pid_start": _start_time(pid) if pid else None,
                  "host": socket.gethostname(), "user": _user(), "expires_at": expires,
                  "created_at": time.time(), "command": command}
        path = _holder_path(folder, uuid)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            json.dump(holder, fh)
        os.replace(tmp, path)  # atomic: readers see the old file or the new one
    res = Reservation(list(uuids), folder, pid, expires)
    if pid == os.getpid():
        atexit.register(res.release)
    return res


def _user() -> str | None:
    try:
        return psutil.Process().username()
    except (psutil.Error, OSError):
        return None
