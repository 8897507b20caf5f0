"""Child process trees that end with the process that started them, however it ends.

A server such as ``mlflow ui`` is a tree (its CLI, the web server, MLflow's job consumers: 13 processes) and
``torchrun`` is one (its agent and one process per rank). Killed by its PID, the parent takes none of it down:
the tree keeps serving the port or holding the GPUs. So each tree is started in a session (and so a process group)
of its own, and :func:`run_group` stops the whole group when the parent returns, is interrupted (Ctrl-C, SIGTERM)
or dies outright (SIGKILL: a watchdog process, in a session of its own, holds the read end of a pipe whose only
writer is the parent; when the parent is gone the pipe closes and the watchdog stops the group). Stopping is
SIGTERM to the group, then SIGKILL to what is left after a grace period.

The launcher's Ray instance has its own watchdog (:func:`noisydml.tools.launch.start_watchdog`: Ray's processes
start sessions of their own, so they are recorded by PID); the tracking process exits when its stage's pipe closes
(:class:`noisydml.tracking.TrackingProcess`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Sequence

#: Seconds a group has between SIGTERM and SIGKILL.
GRACE_SECONDS = 10.0

# stdlib only, so that it starts in a moment: wait for the pipe to close, then stop the group
_WATCHDOG = """
import os, signal, sys, time
fd, group, grace = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
while os.read(fd, 1):
    pass
def alive():
    try:
        os.killpg(group, 0)
        return True
    except OSError:
        return False
if alive():
    try:
        os.killpg(group, signal.SIGTERM)
    except OSError:
        pass
    deadline = time.time() + grace
    while alive() and time.time() < deadline:
        time.sleep(0.1)
    if alive():
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
"""


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop_group(group: int, grace: float = GRACE_SECONDS) -> None:
    """SIGTERM to process group ``group``, SIGKILL to what is left of it after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + wait
        while group_alive(group) and time.time() < deadline:
            time.sleep(0.1)
        if not group_alive(group):
            return


def start_watchdog(group: int, grace: float = GRACE_SECONDS) -> int:
    """Start a watchdog that stops process group ``group`` once this process is gone; return the pipe's write end
    (close it to stop the group without this process ending)."""
    read, write = os.pipe()
    subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(read), str(group), str(grace)], pass_fds=(read,),
                     start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, close_fds=True)
    os.close(read)
    os.set_inheritable(write, False)
    return write


def run_group(command: Sequence[str], grace: float = GRACE_SECONDS, **popen: object) -> int:
    """Run ``command`` as a process group of its own and return its exit status; the group is stopped when it
    is done, when this process is interrupted (SIGINT, SIGTERM: then 130 / 143 is returned), or when this process
    dies (the watchdog). The child and what it starts are the group: one that starts a session of its own leaves
    it (Ray does; the launcher records those)."""
    child = subprocess.Popen(list(command), start_new_session=True, **popen)  # type: ignore[arg-type]
    watchdog = start_watchdog(child.pid, grace)
    stopped: list[int] = []

    def stop(signum, _frame):
        stopped.append(signum)
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()  # only the main thread may set handlers
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        return child.wait()
    except KeyboardInterrupt:
        return 128 + (stopped[0] if stopped else signal.SIGINT)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_group(child.pid, grace)
        child.poll()
        os.close(watchdog)
