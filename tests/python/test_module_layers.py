"""The C++ modules' dependencies point down (DESIGN.md, Layers), as their #include lines show: core includes no other
module (but the simulated GPU, which replaces its lowest layer in that build); the collectives layer's settings
(shardkit/collectives/options.hpp, their own small target) include only core, so that launch can fill them; launch
includes of collectives only those settings; and collectives includes nothing of launch but its MPI wrapper
(launch/mpi.hpp): the environment, the Runtime and the clock-offset measurement reach it as options and JobInfo,
handed down."""
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r'^\s*#\s*include\s+"shardkit/([a-z_]+)/([A-Za-z0-9_./]+)"', re.M)

pytestmark = pytest.mark.processes  # reads files: once, not once per rank count


def includes(*paths):
    """(file, module, header) for every shardkit header that the C++ sources under `paths` include."""
    found = []
    for top in paths:
        for path in sorted((REPO / top).rglob("*")):
            if path.suffix in {".cpp", ".hpp", ".cu", ".h"} and path.is_file():
                for module, header in INCLUDE.findall(path.read_text(errors="replace")):
                    found.append((str(path.relative_to(REPO)), module, header))
    return found


def outside(found, allowed):
    return [f"{f}: shardkit/{m}/{h}" for f, m, h in found if (m, h) not in allowed and (m, "*") not in allowed]


def test_the_scan_sees_includes():
    assert len(includes("collectives")) > 100


def test_core_includes_only_core():
    assert not outside(includes("core"), {("core", "*"), ("sim", "*")})


def test_the_collectives_settings_include_only_core():
    found = [i for i in includes("collectives") if i[0] in ("collectives/include/shardkit/collectives/options.hpp",
                                                            "collectives/src/options.cpp")]
    assert found, "options.hpp and options.cpp were not scanned"
    assert not outside(found, {("core", "*"), ("collectives", "options.hpp")})


def test_launch_includes_of_collectives_only_its_settings():
    assert not outside(includes("launch"), {("core", "*"), ("launch", "*"), ("collectives", "options.hpp")})


def test_collectives_includes_of_launch_only_the_mpi_wrapper():
    assert not outside(includes("collectives"), {("core", "*"), ("collectives", "*"), ("launch", "mpi.hpp")})
