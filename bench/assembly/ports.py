"""The port the ranks of a multi-rank run meet on (MASTER_PORT), and the launcher's pid they inherit.

Before Fabric's own launcher starts the ranks (one node, no torchrun or SLURM), the launching process
makes sure rank 0 can listen on MASTER_PORT: a port the user set that another process holds is one
error line naming it and a free one; with none set, fedbench picks a free port itself. A port taken
in the moment between that check and rank 0's listen is the same one line (``port_error``), not torch's
DistNetworkError traceback.

The launching process also leaves its pid in ``FEDBENCH_LAUNCHER_PID``, which the ranks inherit:
a rank ties its life to that pid (bench/core/lifetime.py ``die_with_parent``), so that a rank whose
launcher died while the rank was still importing exits at once instead of running on under init.
"""
from __future__ import annotations

import errno
import os
import re
import socket

from bench.core.errors import FedbenchError

LAUNCHER_PID_ENV = "FEDBENCH_LAUNCHER_PID"
PICKED_ENV = "FEDBENCH_PICKED_PORT"  # the MASTER_PORT fedbench chose (not the user's)


def port_in_use(port: int) -> bool:
    """Whether a listening socket on ``port`` (all IPv4 addresses, as torch's TCPStore listens) fails."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
            sock.listen(1)
        except OSError as err:
            if err.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def free_port() -> int:
    """A port no process listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def launches_own_ranks(num_nodes: int) -> bool:
    """Whether Fabric's subprocess launcher will start the ranks here: this is the launching process (not a
    rank it started) of a one-node run, not under torchrun or SLURM (whose launchers own the port)."""
    env = os.environ
    return (num_nodes == 1 and "LOCAL_RANK" not in env and "TORCHELASTIC_RUN_ID" not in env
            and "SLURM_NTASKS" not in env)


def prepare_master_port(num_nodes: int) -> int | None:
    """In the launching process of a multi-rank run: the port the ranks will meet on, checked free (a busy
    one the user set is a FedbenchError; with none set, or fedbench's own earlier choice now busy, a free
    one is picked), and this process's pid for the ranks (``LAUNCHER_PID_ENV``). None where another
    launcher owns the port."""
    if not launches_own_ranks(num_nodes):
        return None
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    text = os.environ.get("MASTER_PORT")
    if text is None or text == os.environ.get(PICKED_ENV):
        port = int(text) if text is not None and not port_in_use(int(text)) else free_port()
        os.environ["MASTER_PORT"] = os.environ[PICKED_ENV] = str(port)
        return port
    try:
        port = int(text)
        if not 0 < port < 65536:
            raise ValueError
    except ValueError:
        raise FedbenchError(f"MASTER_PORT={text!r} is not a port number (1-65535). Set it to a free port, "
                            f"e.g. MASTER_PORT={free_port()}, or unset it to let fedbench pick one.") from None
    if port_in_use(port):
        raise FedbenchError(busy_message(port, user_set=True))
    return port


def busy_message(port: int | str, user_set: bool) -> str:
    fix = (f"Set MASTER_PORT to a free port, e.g. MASTER_PORT={free_port()}, or unset it to let fedbench pick one."
           if user_set else "Run the command again: fedbench picks a free port each time.")
    return (f"MASTER_PORT={port} is in use by another process, so the ranks cannot meet on it "
            f"(address already in use). {fix}")


def port_error(err: BaseException) -> FedbenchError | None:
    """The one-line error for torch's failure to listen on MASTER_PORT (DistNetworkError, EADDRINUSE), or
    None for any other error."""
    text = str(err)
    if "EADDRINUSE" not in text and "address already in use" not in text.lower():
        return None
    named = re.search(r"port: (\d+)", text)
    port = named.group(1) if named else os.environ.get("MASTER_PORT", "?")
    return FedbenchError(busy_message(port, user_set=port != os.environ.get(PICKED_ENV)))


def launcher_pid() -> int | None:
    """The pid of the process that launched this rank (``LAUNCHER_PID_ENV``), or None when not given."""
    try:
        return int(os.environ[LAUNCHER_PID_ENV])
    except (KeyError, ValueError):
        return None
