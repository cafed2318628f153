"""The code snippets of README.md and of the documentation site's pages (docs/, in mkdocs.yml's order), taken out as
written so that tests run them (they cannot rot).

- ``python`` blocks: each one a program of its own (``tests/python/test_readme.py`` runs each under mpirun).
- ``cmake`` block (one in all the pages): the consumer project's whole ``CMakeLists.txt``; ``cpp`` blocks: that
  project's ``main.cpp``, one program made of every block in order, the README's first, then each page's
  (``tests/install``'s ``readme_cpp`` test installs shardkit, builds the consumer and runs it). ``#include`` and
  ``using namespace`` lines go to the top of the file; the first block (the one that makes the ``Runtime``) opens
  ``main``; every later block runs in a scope of its own, so blocks may reuse names; the program ends by printing
  ``readme snippets ok on rank R``.
- Shell blocks are commands (build, install, launch) and are not run here.

Command line: ``readme_snippets.py cpp OUT_DIR`` writes the consumer project into OUT_DIR; ``readme_snippets.py
list`` prints each block's page, line, language and first line.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
_FENCE = re.compile(r"^```(\w*)\s*$")
_NAV_PAGE = re.compile(r"^\s*-\s*[^:]+:\s*(\S+\.md)\s*$")


def pages():
    """README.md, then the documentation site's pages in mkdocs.yml's nav order."""
    out = [README]
    for line in (ROOT / "mkdocs.yml").read_text().splitlines():
        match = _NAV_PAGE.match(line)
        if match:
            out.append(ROOT / "docs" / match.group(1))
    return out


def _name(path):
    return str(pathlib.Path(path).resolve().relative_to(ROOT))


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


def of_language(language, paths=None):
    """Every block of `language` in the pages (default: all of them, in order) as ("page:line", text)."""
    return [(f"{_name(path)}:{start}", text) for path in (paths or pages())
            for lang, start, text in blocks(path) if lang == language]


def cpp_program(paths=None):
    """main.cpp made of the pages' C++ blocks (see the module's docstring)."""
    head, body = ["#include <cstdio>"], []
    cpp = of_language("cpp", paths)
    if not cpp:
        raise ValueError("the pages have no cpp block")
    for index, (start, text) in enumerate(cpp):
        code = []
        for line in text.splitlines():
            if line.startswith("#include") or line.startswith("using namespace"):
                head.append(line)
            else:
                code.append(line)
        code = "\n".join(code).strip("\n").splitlines()
        body.append(f"  // {start}")
        indent = "  " if index == 0 else "    "
        if index > 0:
            body.append("  {")
        body += [indent + line if line else "" for line in code]
        if index > 0:
            body.append("  }")
    return ("\n".join(head) + "\n\nint main(int argc, char** argv) {\n" + "\n".join(body) +
            '\n  std::printf("readme snippets ok on rank %d\\n", rt.rank());\n  return 0;\n}\n')


def write_cpp_project(out_dir, paths=None):
    cmake = of_language("cmake", paths)
    if len(cmake) != 1:
        raise ValueError(f"expected one cmake block (the consumer's CMakeLists.txt) in the pages, found {len(cmake)}")
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "CMakeLists.txt").write_text(cmake[0][1])
    (out / "main.cpp").write_text(cpp_program(paths))


def main(argv):
    if len(argv) == 3 and argv[1] == "cpp":
        write_cpp_project(argv[2])
    elif len(argv) == 2 and argv[1] == "list":
        for path in pages():
            for lang, start, text in blocks(path):
                print(f"{_name(path)}:{start} {lang or '-':7s} {text.splitlines()[0] if text.strip() else ''}")
    else:
        print("usage: readme_snippets.py cpp OUT_DIR | readme_snippets.py list", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
