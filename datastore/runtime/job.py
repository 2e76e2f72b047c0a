"""How a job of several MPI processes is started and ended: wrong launchers refused, and an
uncaught exception on any rank printed once and ending every rank (as `python -m mpi4py` does).

`arm()` is called where a DataStore or a torch process group (dstore.training.dist) opens, and the
hold it returns released where that closes cleanly: in between, `sys.excepthook` is ours, so a user's own script
started as `mpiexec -n N python script.py` ends when one rank raises, instead of the other ranks
waiting forever in their next collective. The command line (dstore.tools.cli) ends a failing job
with the same `report_and_abort`. mpi4py is imported inside functions: importing this module does
not initialise MPI.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

from dstore.errors import ConfigError, DStoreError, shown

ERROR_GRACE_S = 3.0
"""How long a failing rank other than 0 waits before printing: if rank 0 failed too (an error every
rank meets, such as a bad flag or a missing file), rank 0's abort ends it first, so a job prints one
copy of the error, not one per rank. Ranks wait in rank order, so of several failing ranks the
lowest prints. Seconds, not less: on a loaded node ranks reach the same error seconds apart."""

ABORT_FLUSH_S = 0.2
"""Seconds a failing rank waits between printing its error and aborting the job. Well under the
0.5 s between ranks' delays (`error_delay`), or the next failing rank prints a second copy."""

INTERRUPT_GRACE_S = 2.0
"""How long a rank ended by Ctrl-C or SIGTERM waits before it aborts a job of several ranks. The
launcher forwards the signal to every rank and each unwinds its own clean-up (an ingest's
temporaries and locks); the first rank's abort killed a slower one mid-way, leaving its files (seen
under load in test_ingest_signals). A rank that did not get the signal is ended by the abort after it."""

LAUNCH_LINE = (
    "mpiexec -n N python your_script.py (or `python -m mpi4py your_script.py`); under Slurm "
    "srun -n N --mpi=pmi2 (pmix for Open MPI)"
)
"""The launch line the documentation tells a user to copy (README, docs/guide.md)."""


class LauncherError(ConfigError):
    """The process was started as one of N separate 1-rank MPI jobs (torchrun, srun without PMI)."""


_LAUNCHER_VARS = (
    ("WORLD_SIZE", "torchrun (or another torch.distributed launcher)"),
    ("LOCAL_WORLD_SIZE", "torchrun (or another torch.distributed launcher)"),
    ("SLURM_STEP_NUM_TASKS", "srun without a PMI that this MPI library speaks"),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun, while mpi4py uses another MPI library"),
    ("PMI_SIZE", "an MPI launcher of another MPI library than mpi4py's"),
)


def launcher_mismatch(environ, mpi_size: int, command: str = "dstore ...") -> str | None:
    """Why this process looks started as one of N separate 1-rank MPI jobs, or None.

    torchrun (and srun without a matching PMI, or another MPI's mpirun) starts N processes that
    each see an MPI world of one: they would each train alone, all writing the same run directory.
    The launcher's own environment variables (WORLD_SIZE, LOCAL_WORLD_SIZE, SLURM_STEP_NUM_TASKS,
    OMPI_COMM_WORLD_SIZE, PMI_SIZE) say how many processes it started.

    Args:
        environ: the process environment (a mapping).
        mpi_size: the size of MPI's COMM_WORLD.
        command: what the launch line in the message starts (`dstore ...`, `python script.py`).
    """
    if mpi_size != 1:
        return None
    for var, who in _LAUNCHER_VARS:
        try:
            n = int(environ.get(var, "1"))
        except ValueError:
            continue
        if n > 1:
            return (
                f"{var}={n} but MPI sees a world of 1 process: this looks started by {who}, which starts "
                f"{n} separate 1-rank MPI jobs (each would run alone, all writing the same files). dstore "
                f"bootstraps torch.distributed from MPI itself: start it with `mpiexec -n {n} {command}`, "
                f"or under Slurm `srun -n {n} --mpi=pmi2 {command}` (--mpi=pmix for Open MPI; "
                f"`srun --mpi=list` shows what your site offers), not torchrun"
            )
    return None


def launcher_rank(environ) -> int:
    """This process's rank as its launcher numbered it, read before MPI starts (so that one prints)."""
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        try:
            return int(environ.get(var, ""))
        except ValueError:
            continue
    return 0


def world() -> tuple[int, int]:
    """(rank, size) of MPI's COMM_WORLD."""
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def error_delay(rank: int) -> float:
    """Seconds rank `rank` waits before printing its error (see ERROR_GRACE_S)."""
    return 0.0 if rank == 0 else ERROR_GRACE_S + 0.5 * min(rank, 8)


def describe(exc: BaseException) -> str:
    """One line for our own errors (DStoreError: the message says it all, escaped by `shown`: a name it
    quotes cannot end the line or send the terminal a control sequence), a traceback otherwise."""
    if isinstance(exc, DStoreError):
        return f"{type(exc).__name__}: {shown(str(exc))}"
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()


def report_and_abort(
    code: int, msg: str | None, *, settle: float = 0.0, host: str | None = None, delay: float | None = None
) -> int:
    """Prints `msg` once for the whole job and, with several ranks, aborts every rank with `code`
    (after `settle` seconds, for the other ranks to finish what they are doing: INTERRUPT_GRACE_S).

    Rank 0 prints at once; another rank first waits `error_delay(rank)`, so that an error met by
    every rank is printed by rank 0 alone (its abort ends the others while they wait), and an error
    of one rank is still printed, by that rank. Returns `code` (only with one rank).

    Args:
        host: named in the line's prefix (`dstore: error on rank 2/4 (host node2): ...`).
        delay: seconds to wait before printing, instead of `error_delay(rank)`.
    """
    rank, size = world()
    if size > 1 and settle > 0:
        time.sleep(settle)
    if msg is not None:
        if size > 1:
            time.sleep(error_delay(rank) if delay is None else delay)
        where = f" (host {host})" if host else ""
        prefix = f"dstore: error on rank {rank}/{size}{where}: " if size > 1 else f"dstore: error{where}: "
        sys.stderr.write(prefix + msg + "\n")
        sys.stderr.flush()
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        pass
    if size > 1:
        from mpi4py import MPI

        if msg is not None:
            # A margin for the launcher to forward what this rank wrote before the abort (see
            # docs/reliability.md, "Lost error messages").
            time.sleep(ABORT_FLUSH_S)
        unlink_mpi_shm()
        MPI.COMM_WORLD.Abort(code)
    return code


def unlink_mpi_shm(maps: str = "/proc/self/maps") -> list[str]:
    """Removes the names of the MPI library's shared-memory files this process has mapped
    (`/dev/shm/mpich_shm_*`): MPICH removes them in MPI_Finalize, never on MPI_Abort, so every
    aborted job left one (2 MiB and up) in /dev/shm. Called just before aborting: the job's other
    ranks keep their mappings (only the name goes), and the abort ends them. Returns what went."""
    gone = []
    try:
        with open(maps) as fh:
            paths = {line.split(None, 5)[5].strip() for line in fh if "/dev/shm/mpich_shm_" in line}
    except (OSError, IndexError):
        return gone
    for path in sorted(p for p in paths if not p.endswith("(deleted)")):
        try:
            os.unlink(path)
            gone.append(path)
        except OSError:
            pass  # another rank of the job removed it first
    return gone


# --- the exception hook while a store or a process group is open -----------------------------

_lock = threading.Lock()
_armed = 0
_previous = None


def _hook(exc_type, exc, tb) -> None:
    """sys.excepthook while armed: several ranks: print once, abort the job; one rank: our own
    errors in one line, anything else as Python prints it."""
    if exc is None:
        exc = exc_type()
    if exc.__traceback__ is None:
        exc = exc.with_traceback(tb)
    if world()[1] == 1:
        if isinstance(exc, DStoreError):
            if not isinstance(exc, LauncherError) or launcher_rank(os.environ) == 0:
                sys.stderr.write(f"dstore: error: {describe(exc)}\n")
            return
        (_previous or sys.__excepthook__)(exc_type, exc, tb)
        return
    code = 130 if isinstance(exc, KeyboardInterrupt) else 1
    report_and_abort(code, describe(exc))


class Armed:
    """One hold on the aborting exception hook (`arm()`); `release()` is safe to call twice."""

    def __init__(self):
        self._held = True

    def release(self) -> None:
        """Gives the hold back: the last one restores the hook that was there before. Called on a
        clean close only: after an error the hook stays, since that error is on its way up."""
        global _armed, _previous
        with _lock:
            if not self._held:
                return
            self._held = False
            _armed -= 1
            if _armed == 0 and sys.excepthook is _hook:
                sys.excepthook, _previous = _previous or sys.__excepthook__, None


def arm(command: str = "python your_script.py") -> Armed:
    """Refuses a wrong launcher (LauncherError), then installs the aborting exception hook until
    every hold returned is released. Called by DataStore and init_distributed.

    Args:
        command: what the launcher error's suggested launch line starts.

    Raises:
        LauncherError: this process is one of N separate 1-rank MPI worlds (torchrun, srun without
            PMI); the hook is installed already, so uncaught it prints one line (launcher rank 0).
    """
    global _armed
    with _lock:
        _armed += 1
        held = Armed()
    reassert()
    problem = launcher_mismatch(os.environ, world()[1], command)
    if problem is not None:
        raise LauncherError(problem)
    return held


def reassert() -> None:
    """Puts the aborting hook back on top while armed. torch's `init_process_group` installs its
    own `sys.excepthook` around the one it finds, and it runs that one with `sys.stderr` redirected to a
    buffer it prints afterwards: our abort would end the job before the buffer is written, losing the
    message. So the hook is taken back after the group is made (and at every `arm()`); the hook it
    gives back on the last release is still the one found before the first hold."""
    global _previous
    with _lock:
        if _armed > 0 and sys.excepthook is not _hook:
            if _previous is None:
                _previous = sys.excepthook
            sys.excepthook = _hook


def armed() -> bool:
    """True while some store or process group holds the aborting exception hook."""
    return _armed > 0
