"""The code snippets of README.md, taken out as written so that tests run them (they cannot rot).

- ``python`` blocks: each one a program of its own (``tests/python/test_readme.py`` runs each under mpirun).
- ``cmake`` block: the consumer project's whole ``CMakeLists.txt``; ``cpp`` blocks: that project's ``main.cpp``,
  one program made of every block in order (``tests/install``'s ``readme_cpp`` test installs shardkit, builds the
  consumer and runs it). ``#include`` and ``using namespace`` lines go to the top of the file; the first block (the
  one that makes the ``Runtime``) opens ``main``; every later block runs in a scope of its own, so blocks may reuse
  names; the program ends by printing ``readme snippets ok on rank R``.
- Shell blocks are commands (build, install, launch) and are not run here.

Command line: ``readme_snippets.py cpp OUT_DIR`` writes the consumer project into OUT_DIR; ``readme_snippets.py
list`` prints each block's language and first line.
"""
import pathlib
import re
import sys

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
_FENCE = re.compile(r"^```(\w*)\s*$")


def blocks(path=README):
    """Every fenced block of the file as (language, first line number, text)."""
    found, lang, start, lines = [], None, 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = _FENCE.match(line)
        if lang is None and match:
            lang, start, lines = match.group(1), number + 1, []
        elif lang is not None and line.strip() == "```":
            found.append((lang, start, "\n".join(lines) + "\n"))
            lang = None
        elif lang is not None:
            lines.append(line)
    if lang is not None:
        raise ValueError(f"{path}: the block opened at line {start - 1} is never closed")
    return found


def of_language(language, path=README):
    return [(start, text) for lang, start, text in blocks(path) if lang == language]


def cpp_program(path=README):
    """main.cpp made of the README's C++ blocks (see the module's docstring)."""
    head, body = ["#include <cstdio>"], []
    cpp = of_language("cpp", path)
    if not cpp:
        raise ValueError(f"{path} has no cpp block")
    for index, (start, text) in enumerate(cpp):
        code = []
        for line in text.splitlines():
            if line.startswith("#include") or line.startswith("using namespace"):
                head.append(line)
            else:
                code.append(line)
        code = "\n".join(code).strip("\n").splitlines()
        body.append(f"  // README.md line {start}")
        indent = "  " if index == 0 else "    "
        if index > 0:
            body.append("  {")
        body += [indent + line if line else "" for line in code]
        if index > 0:
            body.append("  }")
    return ("\n".join(head) + "\n\nint main(int argc, char** argv) {\n" + "\n".join(body) +
            '\n  std::printf("readme snippets ok on rank %d\\n", rt.rank());\n  return 0;\n}\n')


def write_cpp_project(out_dir, path=README):
    cmake = of_language("cmake", path)
    if len(cmake) != 1:
        raise ValueError(f"{path}: expected one cmake block (the consumer's CMakeLists.txt), found {len(cmake)}")
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "CMakeLists.txt").write_text(cmake[0][1])
    (out / "main.cpp").write_text(cpp_program(path))


def main(argv):
    if len(argv) == 3 and argv[1] == "cpp":
        write_cpp_project(argv[2])
    elif len(argv) == 2 and argv[1] == "list":
        for lang, start, text in blocks():
            print(f"{start:4d} {lang or '-':7s} {text.splitlines()[0] if text.strip() else ''}")
    else:
        print("usage: readme_snippets.py cpp OUT_DIR | readme_snippets.py list", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
