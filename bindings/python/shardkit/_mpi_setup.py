"""MPI start-up for the Python package: cooperate with mpi4py, refuse a mismatched MPI, own what we initialise.

Order matters. mpi4py, when installed, is imported first with automatic initialisation turned off (unless it was
already imported, in which case it may own MPI already): then both libraries are known before anyone initialises
MPI, and a mismatch (shardkit linked against one MPI, mpi4py loading another) is refused with a clear message
instead of crashing. shardkit then initialises MPI itself (or adopts mpi4py's), and an atexit hook frees
shardkit's communicators and finalises only what shardkit initialised.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import sys

from . import _core


def _mpi4py():
    """mpi4py.MPI if mpi4py is installed, without letting it initialise MPI on import; None otherwise."""
    if "mpi4py.MPI" in sys.modules:
        return sys.modules["mpi4py.MPI"]
    if importlib.util.find_spec("mpi4py") is None:
        return None
    import mpi4py

    # shardkit initialises MPI with the thread level it needs; mpi4py adopts it (and, not having initialised it,
    # will not finalise it).
    mpi4py.rc.initialize = False
    from mpi4py import MPI

    return MPI


def _first_line(text: str) -> str:
    """The first line of a library version string, without padding (NULs, spaces, a trailing comma)."""
    lines = text.replace("\x00", "").strip().splitlines()
    return " ".join(lines[0].split()).rstrip(",") if lines else ""


def check_same_mpi(mpi4py_version: str, ours: str) -> None:
    """Raises ImportError when mpi4py runs a different MPI library than the one shardkit is linked against."""
    theirs_line, ours_line = _first_line(mpi4py_version), _first_line(ours)
    if theirs_line != ours_line:
        raise ImportError(
            "shardkit and mpi4py use different MPI libraries, which cannot share one process:\n"
            f"  shardkit was built against: {ours_line}\n"
            f"  mpi4py loaded:              {theirs_line}\n"
            "Rebuild shardkit against the MPI that mpi4py uses (pip install --no-binary=shardkit ., with that MPI's "
            "mpicc first on PATH), or make mpi4py load shardkit's MPI (for mpi4py's binary wheels: "
            "MPI4PY_LIBMPI=<path to that libmpi.so>), or build mpi4py from source against it "
            "(pip install --no-binary=mpi4py mpi4py)."
        )


def initialize() -> None:
    """Runs at `import shardkit`."""
    MPI = _mpi4py()
    if MPI is not None:
        check_same_mpi(MPI.Get_library_version(), _core.mpi_library_version())
    _core.init()
    atexit.register(_shutdown)
    # The default communicator (comm=None: a clone of COMM_WORLD), now, while every rank is here: made later by the
    # first call that names it, a point-to-point exchange between two ranks would wait for all the others (its
    # creation is collective), as mpi4jax's lazy clone does.
    _core.world()
    if _core.size() > 1 and os.environ.get("SHARDKIT_ABORT_ON_EXCEPTION", "1") != "0":
        _install_abort_hook()


def _install_abort_hook() -> None:
    """An uncaught exception on one rank ends the whole job (as `python -m mpi4py` does), instead of leaving the
    other ranks waiting in a collective forever while this one tries to finalise. SHARDKIT_ABORT_ON_EXCEPTION=0
    turns it off."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        previous(exc_type, exc, tb)  # the traceback first
        try:
            sys.stderr.flush()
        finally:
            _core.abort(1, f"uncaught {exc_type.__name__} on rank {_core.rank()}")

    sys.excepthook = hook


def _shutdown() -> None:
    # A collective that timed out left MPI unable to finalise cleanly: the C++ Runtime ends the job with MPI_Abort
    # (and says why) instead of hanging here.
    _core.shutdown()
