"""The package's imports point one way. The JAX layer, the subpackage shardkit.jax, imports the core modules, and no
core module imports it: the core calls it through what it registers (shardkit._hooks), and shardkit._after_jax loads it
by name once JAX is imported (the plug-in's loading, the one import by name in the package). No two shardkit modules
import each other, directly or around a circle, and no shardkit module is imported inside a function (where such a
circle hides). Read from the source of the package the suites test (ast), without importing it.

And at run time: ``import shardkit`` alone never imports JAX, while importing JAX (before or after shardkit) loads the
JAX layer, which makes ShardedArray a pytree without starting JAX's backends (the layer connects to XLA and to the C++
side at its first use).

The static checks run once, in the python_typecheck entry (typecheck marker); the run-time ones start their own Python
processes (the processes marker, in python_processes).
"""

import ast
import importlib.machinery
import importlib.util
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import python

PACKAGE = "shardkit"
JAX_LAYER = "shardkit.jax"
# The plug-in loader: the one module that imports a shardkit module by name (importlib), and only the JAX layer.
LOADER = "shardkit._after_jax"
# How a module is imported by name: importlib.import_module(...) and __import__(...), called in any spelling.
BY_NAME = {"import_module", "__import__"}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the shardkit module imported, the most specific one named (`from . import _core`: shardkit._core)
    line: int
    in_function: bool
    by_name: bool = False  # importlib.import_module("...") rather than an import statement

    def __str__(self):
        where = "inside a function" if self.in_function else "at module level"
        how = "by name" if self.by_name else "imports"
        return f"{self.source} (line {self.line}, {where}) {how} {self.target}"


def package_dir():
    """The folder of the shardkit package the suites test (found, not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    assert spec is not None and spec.origin, "shardkit is not importable"
    return Path(spec.origin).parent


def modules(root):
    """{module name: its source file, or None for an extension module} of every module of the package under root."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if "__pycache__" in rel.parts or not path.is_file():
            continue
        if path.suffix == ".py":
            parts = [PACKAGE, *rel.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
        else:
            suffix = next((s for s in importlib.machinery.EXTENSION_SUFFIXES if path.name.endswith(s)), None)
            if suffix is not None:
                out[".".join([PACKAGE, *rel.parent.parts, path.name[:-len(suffix)]])] = None
    return out


def _absolute(module, level, package):
    """The absolute name of `from <level dots><module> import ...` in a module of `package`."""
    if level == 0:
        return module
    parts = package.split(".")
    base = parts[:len(parts) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _ours(name):
    return name == PACKAGE or name.startswith(PACKAGE + ".")


def _by_name_target(call):
    """For a call importing a module by name: the name (None where it is not a constant string); else False."""
    fn = call.func
    name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
    if name not in BY_NAME:
        return False
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def imports_of(name, is_package, source, known):
    """Every import of a shardkit module in module `name` (a package's __init__ where `is_package`), from its source
    text: import statements at any depth (under if, try and TYPE_CHECKING too), and imports by name. `known`: the
    package's module names."""
    package = name if is_package else name.rpartition(".")[0]
    found = []

    def add(target, node, in_function, by_name=False):
        if target is None or _ours(target):
            found.append(Import(name, target or "<a name computed at run time>", node.lineno, in_function, by_name))

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, child, inside)
            elif isinstance(child, ast.ImportFrom):
                base = _absolute(child.module, child.level, package)
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    add(sub if sub in known else base, child, inside)
            elif isinstance(child, ast.Call):
                target = _by_name_target(child)
                if target is not False:
                    add(target, child, inside, by_name=True)
            visit(child, inside)

    visit(ast.parse(source, name), False)
    return found


def all_imports():
    known = modules(package_dir())
    return known, [i for name, path in known.items() if path is not None
                   for i in imports_of(name, path.name == "__init__.py", path.read_text(), known)]


def is_jax_layer(name):
    return name == JAX_LAYER or name.startswith(JAX_LAYER + ".")


def find_cycle(edges):
    """One circle of imports ([a, b, ..., a]) in {module: modules it imports}, or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                cycle = visit(n)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(edges):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


@pytest.mark.typecheck
def test_the_layout_is_read():
    # A check that cannot fail checks nothing: the modules and the imports the rules below look at are found.
    known, imports = all_imports()
    for m in ("shardkit", "shardkit._core", "shardkit._hooks", "shardkit._sharding", "shardkit.checkpoint",
              "shardkit.jax", "shardkit.jax._compat", "shardkit.jax._ops", "shardkit.jax._shard_map"):
        assert m in known, f"{m} not found in {package_dir()}: {sorted(known)}"
    edges = {(i.source, i.target) for i in imports}
    assert ("shardkit", "shardkit._sharding") in edges
    assert ("shardkit.jax._shard_map", "shardkit._sharded_array") in edges  # `from .._sharded_array import ...`
    assert ("shardkit.jax", "shardkit._hooks") in edges  # `from .. import _hooks`
    assert any(i.by_name and i.target == JAX_LAYER for i in imports)  # the loader's
    # What the rules call a cycle and a function's import, on a made-up graph and module.
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    source = textwrap.dedent("""
        import numpy
        from . import b
        if TYPE_CHECKING:
            from ..jax import _ops
        def f():
            from .c import d
            importlib.import_module("shardkit.e")
    """)
    found = imports_of("shardkit.sub.a", False, source, {"shardkit.sub.b", "shardkit.sub.c", "shardkit.jax._ops"})
    assert [(i.target, i.in_function, i.by_name) for i in found] == [
        ("shardkit.sub.b", False, False), ("shardkit.jax._ops", False, False), ("shardkit.sub.c", True, False),
        ("shardkit.e", True, True)]


@pytest.mark.typecheck
def test_no_import_cycle_among_shardkit_modules():
    known, imports = all_imports()
    edges = {}
    for i in imports:
        if not i.by_name and i.target in known and i.target != i.source:
            edges.setdefault(i.source, set()).add(i.target)
    cycle = find_cycle(edges)
    assert cycle is None, "shardkit modules import each other in a circle: " + " -> ".join(cycle)


@pytest.mark.typecheck
def test_no_core_module_imports_the_jax_layer():
    _, imports = all_imports()
    wrong = [str(i) for i in imports if not is_jax_layer(i.source) and is_jax_layer(i.target)
             and not (i.by_name and i.source == LOADER)]
    assert wrong == [], ("the core imports the JAX layer (it must register with the core instead, shardkit._hooks):\n"
                         + "\n".join(wrong))


@pytest.mark.typecheck
def test_no_shardkit_module_is_imported_inside_a_function():
    _, imports = all_imports()
    wrong = [str(i) for i in imports if i.in_function and not (i.by_name and i.source == LOADER)]
    assert wrong == [], "shardkit modules imported inside functions (at module level, no circle can hide):\n" + \
        "\n".join(wrong)


@pytest.mark.typecheck
def test_only_the_loader_imports_by_name_and_only_the_jax_layer():
    _, imports = all_imports()
    by_name = [i for i in imports if i.by_name]
    wrong = [str(i) for i in by_name if i.source != LOADER or i.target != JAX_LAYER]
    assert wrong == [], "shardkit modules imported by name outside the JAX layer's loader:\n" + "\n".join(wrong)
    assert [i.target for i in by_name] == [JAX_LAYER]


@pytest.mark.processes
def test_import_shardkit_does_not_import_jax():
    r = python(textwrap.dedent("""
        import sys
        import shardkit as sk
        loaded = [m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib") or m.startswith("shardkit.jax")]
        assert loaded == [], loaded[:5]
        assert sk._hooks.jax_layer() is None
        print("ok")
    """))
    assert r.returncode == 0 and r.stdout.split() == ["ok"], r.stdout + r.stderr


@pytest.mark.processes
@pytest.mark.parametrize("order", ["import shardkit as sk, jax", "import jax, shardkit as sk"])
def test_importing_jax_loads_the_jax_layer(order):
    pytest.importorskip("jax")
    r = python(order + "\n" + textwrap.dedent("""
        import sys
        import jax.numpy as jnp
        import numpy as np
        assert "shardkit.jax" in sys.modules and sk._hooks.jax_layer() is not None
        # Loaded, not yet connected: JAX's backends are not started (a program may still configure them) and the C++
        # side has no hook until the first use.
        from jax._src import xla_bridge
        assert not xla_bridge.backends_are_initialized(), "JAX's backends started by loading the JAX layer"
        assert not hasattr(sk._core, "_jax_hook_refs"), "the C++ hook installed by loading the JAX layer"
        mesh = sk.Mesh((1,), ("x",))
        x = sk.from_local(np.arange(2.0), (2,), sk.NamedSharding(mesh, sk.P("x")))
        assert not jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(x))  # ShardedArray is a pytree
        (leaf,) = jax.tree_util.tree_leaves(x)
        assert np.array_equal(leaf, np.arange(2.0))
        r, _ = sk.mpi.allreduce(jnp.arange(3.0), op="sum")  # the first use: connected
        assert hasattr(sk._core, "_jax_hook_refs") and np.array_equal(r, np.arange(3.0))
        print("ok")
    """))
    assert r.returncode == 0 and r.stdout.split() == ["ok"], r.stdout + r.stderr
