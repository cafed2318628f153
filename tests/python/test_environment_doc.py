"""docs/environment.md is the one list of shardkit's environment variables: every ``SHARDKIT_*`` name that the
libraries, the Python package, the launcher and the simulated GPU read (a string literal in their sources) is a row of
its tables, and every row names a variable they read. Test hooks (``SHARDKIT_*_TEST_*``) are not for users and are
left out."""
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SOURCES = ("core", "launch", "collectives", "sharding", "checkpoint", "bindings", "sim")
SUFFIXES = {".cpp", ".hpp", ".cu", ".py"}

pytestmark = pytest.mark.processes  # reads files: once, not once per rank count


def read_by_the_code():
    names = set()
    for top in SOURCES:
        for path in (REPO / top).rglob("*"):
            if path.suffix in SUFFIXES and path.is_file():
                names |= set(re.findall(r"""["'](SHARDKIT_[A-Z0-9_]+)["']""", path.read_text(errors="replace")))
    return {n for n in names if "_TEST_" not in n}


def documented():
    rows = re.findall(r"^\| `(SHARDKIT_[A-Z0-9_]+)` \|", (REPO / "docs" / "environment.md").read_text(), re.M)
    assert len(rows) == len(set(rows)), "a variable has two rows"
    return set(rows)


def test_every_variable_the_code_reads_is_documented_once():
    code, doc = read_by_the_code(), documented()
    assert len(code) > 20, code  # the scan finds the variables at all
    assert not code - doc, f"read by the code but not in docs/environment.md: {sorted(code - doc)}"
    assert not doc - code, f"in docs/environment.md but read nowhere: {sorted(doc - code)}"
