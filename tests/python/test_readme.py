"""The Python snippets of README.md and of the documentation site's pages, run as written under mpirun (their C++ and
CMake snippets: the `readme_cpp` test)."""
import pathlib
import sys

import pytest

from conftest import has_module, mpirun

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "support"))
import readme_snippets  # noqa: E402

pytestmark = pytest.mark.processes
SNIPPETS = readme_snippets.of_language("python")


def test_readme_has_the_python_snippets():
    # the mpi4jax API, sharding and shard_map, and JAX: pages without them would make the test below vacuous
    assert len(SNIPPETS) >= 3
    assert [where for where, _ in SNIPPETS if where.startswith("README.md:")], "the README's first Python program"


@pytest.mark.parametrize("where,code", SNIPPETS, ids=[where for where, _ in SNIPPETS])
def test_readme_python_snippet(where, code, tmp_path):
    if "import jax" in code and not has_module("jax"):
        pytest.skip("JAX is not installed")
    program = tmp_path / f"snippet_{where.replace('/', '_').replace(':', '_line')}.py"
    program.write_text(code + "\nprint('snippet done', flush=True)\n")
    run = mpirun(2, [sys.executable, str(program)], timeout=180, cwd=tmp_path, SHARDKIT_CHECK="1",
                 SHARDKIT_TIMEOUT_S="60")  # in tmp_path: a snippet may write files (checkpoints)
    assert run.returncode == 0, f"{where} at 2 ranks:\n{run.stdout}\n{run.stderr}"
    assert run.stdout.count("snippet done") == 2, run.stdout
