"""A job stopped by SIGTERM (what Kubernetes, SLURM and preemption send)
cleans up its shared memory as an interpreter exit does.

Python's default action for SIGTERM ends the process at once: no atexit
handler and no weakref.finalize runs, so the /dev/shm files of the job's
regions stayed behind for good, and the server kept their registrations
for --region_lease, against limits that every job shares. While SIGTERM is
at its default, the first region or shared-memory client installs a handler
that runs their pending finalizers (files unlinked, registrations ended
within 2 s per client) and then dies of SIGTERM by the default action, so
that the parent sees the same end. A handler of the job's own is left
alone (it usually exits through sys.exit, which runs the finalizers too).
Nothing can catch SIGKILL: its files stay until removed by hand.
"""

import os
import signal
import threading
import weakref
from typing import List

# Finalizers to run on SIGTERM. Changed under the lock from any thread;
# the handler (on the main thread) only copies it, so that it never waits
# on a lock that the code it interrupted holds.
_pending: List[weakref.finalize] = []
_lock = threading.Lock()


def _handle(signum: int, _frame) -> None:
    for finalizer in list(_pending):
        try:
            finalizer()  # a finalizer already run does nothing
        except Exception:  # pylint: disable=broad-except
            pass  # the rest still run, and the process still ends
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def run_on_sigterm(finalizer: weakref.finalize) -> None:
    """Runs `finalizer` (if still pending) when SIGTERM comes, installing
    the handler while SIGTERM is at its default and this is the main
    thread (the only one that may install one; a later call from it then
    does)."""
    with _lock:
        _pending[:] = [f for f in _pending if f.alive] + [finalizer]
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _handle)
    except (ValueError, OSError):
        pass  # an interpreter that takes no handlers here
