"""Loads shardkit's JAX layer (the subpackage shardkit.jax) once JAX is imported, without importing JAX: at once if it
is loaded, else right after ``import jax`` has run (a finder on sys.meta_path that wraps jax's loader, and leaves
sys.meta_path as soon as jax is found). Loading it registers ShardedArray as a JAX pytree and the JAX layer with the
core (shardkit._hooks); connecting it to XLA and to the C++ side waits for its first use (shardkit.jax._ops.activate).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

def _load() -> None:
    try:
        # The plug-in, by name: shardkit.jax imports the core modules and registers itself with them (shardkit._hooks),
        # and no core module imports it (tests/python/test_package_layout.py holds every module to that). This is the
        # one place in the package that loads it; the C++ side asks for it by name too, once JAX is loaded
        # (bindings/src/jax/bind_jax.cpp's hook_ready).
        importlib.import_module("shardkit.jax")
    except Exception as e:  # noqa: BLE001  (never break `import jax`)
        warnings.warn(f"shardkit: its JAX layer could not be loaded (ShardedArray is no JAX pytree, and shardkit "
                      f"functions do not take JAX tracers): {e!r}", stacklevel=2)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != "jax":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("jax")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):  # type: ignore[no-untyped-def]
            run(module)
            _load()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    if "jax" in sys.modules:
        _load()
    else:
        sys.meta_path.insert(0, _Finder())
