"""Removes this process's shared-memory files once it is gone, however it
ends.

A job that dies of SIGTERM at its default action (what Kubernetes, SLURM
and preemption send), of SIGKILL, through os._exit or in a crash runs no
finalizer, and its regions' files stayed in /dev/shm for good. A signal
handler would cover SIGTERM only, and would change how the job dies (a
Python handler waits for the main thread to leave C code; a forked child
inherits it). Instead, the first region this process creates starts a small
helper process that reads the pipe this module writes each file's path to,
when the file is made and again when this process removes it itself. When
the pipe's last writer is gone (this process and any forked children of
it), the helper unlinks what is still listed, and exits. It ignores SIGINT
and SIGTERM, which a terminal or a scheduler may send to the job's whole
group, so that it outlives the job by the moment that takes. The files'
registrations with the server end with their leases (--region_lease).
"""

import logging
import os
import subprocess
import sys
import threading
from typing import Optional

# The helper: -I -S, so that no user or site configuration runs in it.
_HELPER = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
paths = set()
for line in sys.stdin.buffer:
    path = os.fsdecode(line[1:-1])
    if line[:1] == b"+":
        paths.add(path)
    else:
        paths.discard(path)
for path in paths:
    try:
        os.unlink(path)
    except OSError:
        pass
"""

_lock = threading.Lock()
_helper: Optional[subprocess.Popen] = None
_started = False  # once per process tree, whether or not the helper started


def _after_fork_in_child() -> None:
    # A forked child writes to the same helper; the lock may have been held
    # by a thread that the child does not have.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _tell(line: bytes) -> None:
    """Writes one line to the helper; one write of at most PIPE_BUF bytes
    (a path under /dev/shm is shorter), so lines from threads and forked
    children never interleave."""
    global _helper, _started
    with _lock:
        if not _started:
            _started = True
            try:
                _helper = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", _HELPER],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, close_fds=True,
                    start_new_session=True)
            except OSError as e:
                logging.getLogger("klserve").warning(
                    "klserve: no helper to remove shared-memory files left "
                    "by a job killed before it could (%s)", e)
        helper = _helper
    if helper is None:
        return
    try:
        os.write(helper.stdin.fileno(), line)
    except OSError:
        pass  # the helper is gone: nothing to tell


def created(path: str) -> None:
    """`path` exists now; the helper removes it if this process ends
    first."""
    _tell(b"+" + os.fsencode(path) + b"\n")


def removed(path: str) -> None:
    """This process removed `path` itself."""
    _tell(b"-" + os.fsencode(path) + b"\n")
