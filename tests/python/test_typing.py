"""The package is typed: py.typed and the generated stub _core.pyi ship with it, mypy finds no error in examples/, shardkit-run and
typed_usage.py, and it does report each wrong call of typed_misuse.py (a check that cannot fail checks nothing).
typed_usage.py also runs here, at every world size, so the types it states are the ones the package has at runtime."""

import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import time

import pytest

from conftest import REPO, has_module

HERE = os.path.dirname(os.path.abspath(__file__))
USAGE = os.path.join(HERE, "typed_usage.py")
MISUSE = os.path.join(HERE, "typed_misuse.py")
LAUNCHER = os.path.join(REPO, "launch", "tools", "shardkit_run")  # shardkit-run, typed too
EXPECTED = re.compile(r"#\s*E:\s*([\w-]+)\s*$")
REPORTED = re.compile(r"^(?P<path>[^:\n]+):(?P<line>\d+): error: .*\[(?P<code>[\w-]+)\]$", re.MULTILINE)


def package_dir():
    """The folder of the shardkit package the suites test (found, not imported)."""
    spec = importlib.util.find_spec("shardkit")
    assert spec is not None and spec.origin, "shardkit is not importable"
    return os.path.dirname(spec.origin)


def test_typed_usage_runs(sk):
    import typed_usage

    typed_usage.run()


@pytest.mark.typecheck
def test_package_ships_its_types():
    pkg = package_dir()
    assert os.path.isfile(os.path.join(pkg, "py.typed")), f"no py.typed in {pkg}"
    stub = os.path.join(pkg, "_core.pyi")
    assert os.path.isfile(stub), f"no _core.pyi in {pkg} (nanobind_add_stub in bindings/CMakeLists.txt)"
    text = open(stub).read()
    for decl in ("class Mesh:", "class NamedSharding:", "class PartitionSpec:", "class ShardedArray:"):
        assert decl in text, f"{decl} missing from {stub}"
    assert "<object object at" not in text and "std::" not in text, "a C++ or unrenderable default in the stub"
    # A fast-call function bound under another name than its own renders as `mpi_x = x`, x undefined: its entry is
    # missing from bindings/stubgen_patterns.txt.
    aliases = re.findall(r"^(\w+) = (\w+)$", text, re.MULTILINE)
    assert not aliases, f"aliases of undefined names in {stub}: {aliases}"


@pytest.mark.typecheck
def test_mypy_over_examples_and_typed_usage():
    if not has_module("mypy"):
        pytest.skip("mypy is not installed (scripts/setup.sh installs it)")
    env = dict(os.environ)
    pkg_parent = os.path.dirname(package_dir())
    site = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    if os.path.realpath(pkg_parent) not in site:
        env["MYPYPATH"] = pkg_parent  # a build tree's package (PYTHONPATH), which mypy does not read
    start = time.monotonic()
    # pyproject.toml's [tool.mypy] (read from the repository root) names the examples and typed_usage.py; the misuse
    # file is added here, so that a plain `python -m mypy` stays clean.
    run = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "examples", LAUNCHER, USAGE, MISUSE], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - start
    print(f"mypy took {elapsed:.1f} s")
    assert run.returncode in (0, 1) and not run.stderr.strip(), f"mypy failed to run:\n{run.stdout}\n{run.stderr}"

    expected = set()
    with open(MISUSE) as f:
        for number, line in enumerate(f, 1):
            m = EXPECTED.search(line)
            if m:
                expected.add((number, m.group(1)))
    assert len(expected) >= 10, "typed_misuse.py lost its cases"
    reported, elsewhere = set(), []
    for m in REPORTED.finditer(run.stdout):
        if os.path.realpath(os.path.join(REPO, m["path"])) == os.path.realpath(MISUSE):
            reported.add((int(m["line"]), m["code"]))
        else:
            elsewhere.append(m.group(0))
    assert not elsewhere, "type errors in the examples or typed_usage.py:\n" + "\n".join(elsewhere)
    assert reported == expected, (f"typed_misuse.py: not reported {sorted(expected - reported)}, "
                                  f"unexpected {sorted(reported - expected)}\n{run.stdout}")
