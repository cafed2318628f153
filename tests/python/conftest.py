"""Shared fixtures of the Python suites.

The suites run under plain pytest (one rank) and under ``mpirun -np N python -m pytest`` (N ranks): expectations are
written in terms of the world size. Tests that start their own mpirun jobs (import order, examples, timeouts) are
marked ``processes`` and run only outside mpirun (a separate ctest entry), since nesting mpirun inside an MPI job
does not work. The type check (``typecheck``: mypy over the examples, once) runs outside mpirun too, in its own entry.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

UNDER_MPIRUN = any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))
# The job's size, known before collection (the launcher's environment), for suites that sweep fewer cases at more ranks.
WORLD_SIZE = int(next((os.environ[v] for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE") if v in os.environ), "1"))
# Whether this run sweeps every dtype (and every refused dtype/reduction pair): at 2 ranks, unless
# SHARDKIT_TEST_WIDE_SWEEP=0 (scripts/jax_versions.sh: another jax release's internals need one dtype of each kind;
# scripts/test.sh sweeps them all on the main environment's jax).
WIDE_SWEEP = WORLD_SIZE == 2 and os.environ.get("SHARDKIT_TEST_WIDE_SWEEP", "1") != "0"
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# The flight-recorder dumps that tests provoke (a mismatch in checked mode, a truncation) go to the temporary directory
# rather than into the working directory (by default `shardkit-dump-<job>` there: the source tree), unless the caller
# or the test names a folder. The jobs tests start inherit it (clean_env).
os.environ.setdefault("SHARDKIT_DUMP_DIR", os.path.join(tempfile.gettempdir(), f"shardkit-test-dumps-{os.getuid()}"))


def has_module(name):
    return importlib.util.find_spec(name) is not None


def pytest_configure(config):
    config.addinivalue_line("markers", "processes: starts its own mpirun jobs (skipped under mpirun)")
    config.addinivalue_line("markers", "typecheck: runs the type checker (skipped under mpirun: once is enough)")


def pytest_collection_modifyitems(config, items):
    if UNDER_MPIRUN:
        skip = pytest.mark.skip(reason="starts its own mpirun jobs; runs in the plain-pytest ctest entry")
        skip_typecheck = pytest.mark.skip(reason="the type check runs once, in its plain-pytest ctest entry")
        for item in items:
            if "processes" in item.keywords:
                item.add_marker(skip)
            elif "typecheck" in item.keywords:
                item.add_marker(skip_typecheck)


@pytest.fixture(scope="session")
def sk():
    import shardkit

    return shardkit


@pytest.fixture(scope="session")
def mpi(sk):
    return sk.mpi


def require_jax():
    """For a module of JAX tests, at import: jax (with 64-bit types on, as the suites' int64 / float64 values need),
    or the whole module skipped where JAX, ml_dtypes or shardkit's JAX layer (built only with jaxlib's FFI headers)
    is missing."""
    jax = pytest.importorskip("jax")
    pytest.importorskip("ml_dtypes")
    import shardkit

    if not shardkit._core._jax_ffi_targets():
        pytest.skip("shardkit was built without jaxlib's headers", allow_module_level=True)
    jax.config.update("jax_enable_x64", True)
    return jax


@pytest.fixture(scope="session")
def rank(sk):
    return sk.rank()


@pytest.fixture(scope="session")
def size(sk):
    return sk.size()


def clean_env(**extra):
    """The environment for a child mpirun: without the variables of an enclosing MPI job, with the root settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_", "PMIX_", "PMI_", "OMPI_MCA_orte"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.update(extra)
    return env


def mpirun(np_, args, timeout=120, cwd=None, **env):
    """Runs `mpirun -np np_ <args>` (in `cwd`) and returns the CompletedProcess (stdout and stderr captured as
    text)."""
    launcher = shutil.which("mpirun") or shutil.which("mpiexec")
    cmd = [launcher, "--oversubscribe", "--bind-to", "none", "-np", str(np_)] + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=clean_env(**env), cwd=cwd)


def python(code, timeout=120, **env):
    """Runs a Python snippet in a fresh interpreter (no mpirun: a singleton MPI job)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=clean_env(**env))
