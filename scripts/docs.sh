#!/usr/bin/env bash
# Builds the documentation site (docs/, mkdocs.yml) into build/site/ with MkDocs, warnings as errors (a broken link or
# anchor fails it); installs MkDocs from PyPI when it is missing. Extra arguments go to `mkdocs build`
# (e.g. `--site-dir DIR`). `python3 -m mkdocs serve` from the repository root previews it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import mkdocs" 2>/dev/null; then
  echo "docs: installing mkdocs"
  "$PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore mkdocs
fi
cd "$ROOT"
"$PYTHON" -m mkdocs build --strict --clean "$@"
echo "docs: built into ${ROOT}/build/site"
