"""Runs shardkit's JAX registrations (ShardedArray as a pytree) once JAX is imported, without importing JAX: at once
if it is loaded, else right after ``import jax`` has run (a finder on sys.meta_path that wraps jax's loader, and leaves
sys.meta_path as soon as jax is found)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings


def _register() -> None:
    try:
        from . import _jax_pytree  # noqa: PLC0415

        _jax_pytree.register()
    except Exception as e:  # noqa: BLE001  (never break `import jax`)
        warnings.warn(f"shardkit: ShardedArray could not be registered as a JAX pytree: {e!r}", stacklevel=2)


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
            _register()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    if "jax" in sys.modules:
        _register()
    else:
        sys.meta_path.insert(0, _Finder())
