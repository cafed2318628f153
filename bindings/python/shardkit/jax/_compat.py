"""Every JAX internal the JAX layer uses (``jax._src``, jaxlib's extension), in one module, as mpi4jax's
``_src/jax_compat.py``: the other modules of shardkit.jax import JAX's private names from here only.

Tested on jax/jaxlib 0.8.3, 0.9.2, 0.10.2 and 0.11.2 (``scripts/jax_versions.sh`` runs the JAX suites on the oldest
and the newest; pyproject.toml declares the range). Where the internals differ between them, a small function here
hides the difference, found by what the installed JAX offers rather than by its version number:

- ``aval_to_ir_type``: jax 0.10's ``mlir.aval_to_ir_type`` takes the module context first; 0.8 and 0.9's take the
  abstract value only.
- ``trace_probe``: where JAX keeps the current trace and axis environment (0.10: two config states read as ``.value``;
  0.8 and 0.9: attributes of the thread-local ``trace_ctx``), for the C++ side to tell tracing from eager calls
  without calling into Python.
- ``host_importer``: jaxlib's DLPack importer takes the device type (kDLCPU) as a fifth argument from 0.10 on.
- ``bind_equation``: a primitive's ``get_bind_params`` returns the parameters to bind in 0.10 ((subfunctions,
  parameters) in 0.8 and 0.9).
- ``pvary``: ``jax.lax.pcast(x, axes, to="varying")`` from 0.10 on (0.8 and 0.9: ``jax.lax.pvary``).
- ``continue_after_failed_programs``: JAX keeps an ordered effect's failed token for good (the same in 0.8 to 0.11);
  shardkit's chain goes on past it.
- ``abstract_mesh``: 0.11 made an ``AbstractMesh``'s axes Explicit by default (Auto before); the check_vma trace
  asks for Auto.
- ``keep_weak_type``: 0.8's axis collectives return a strongly typed value for a weakly typed one (0.10's keep it).
- ``vma``: the mesh axes a value's type varies over (``aval.vma`` where the type has it, as on 0.8; 0.10: its
  ``manual_axis_type``).
- ``AXIS_COLLECTIVES``, ``INLINED_CALLS``, ``CUSTOM_DERIVATIVE_CALLS``: JAX's axis collectives (what shardkit runs
  each as), call primitives and calls with custom derivative rules, in the body of a shard_map that JAX traced with
  check_vma=True (shardkit.jax._check_vma); the ones a release lacks are left out (0.8's psum_invariant and pvary live
  in lax.parallel, 0.10's pvary in core). ``custom_call_jaxpr``, ``custom_call_name`` and ``vma`` read such a call's
  equation and a value's type there (the same on 0.8 to 0.10).

Loaded only once JAX is (shardkit never imports JAX itself).
"""

from __future__ import annotations

import inspect
import warnings

import jax
import numpy as np
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import effects as _effects
# The concrete jax.Array type by name, not as type(jnp.zeros(())): this module may be loaded while JAX traces, when
# jnp.zeros makes a tracer.
from jax._src.array import ArrayImpl
from jax._src.interpreters import ad, batching, mlir
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import hlo
from jax._src.lax import parallel as _parallel

__all__ = ["AXIS_COLLECTIVES", "CUSTOM_DERIVATIVE_CALLS", "INLINED_CALLS", "TESTED_VERSIONS", "ArrayImpl",
           "ClosedJaxpr", "bind_equation", "continue_after_failed_programs", "custom_call_jaxpr", "custom_call_name",
           "keep_weak_type", "pvary", "Jaxpr", "Literal", "Primitive", "ShapedArray", "Token", "Tracer", "ad",
           "apply_primitive", "aval_to_ir_type", "batching", "hlo", "host_importer", "ir", "mlir", "ordered_effect",
           "trace_probe", "trace_state_clean", "user_context", "vma"]

TESTED_VERSIONS = ("0.8.3", "0.9.2", "0.10.2", "0.11.2")

Primitive = _core.Primitive
ShapedArray = _core.ShapedArray
Token = _core.Token
Tracer = _core.Tracer
trace_state_clean = _core.trace_state_clean
apply_primitive = _dispatch.apply_primitive
Literal = _core.Literal
Jaxpr = _core.Jaxpr
ClosedJaxpr = _core.ClosedJaxpr


def bind_equation(prim, args, params):
    """prim bound to args with a jaxpr equation's parameters (as core.eval_jaxpr binds them)."""
    bound = prim.get_bind_params(params)
    if isinstance(bound, tuple):  # 0.8, 0.9: (subfunctions, parameters)
        subfuns, bound = bound
        return prim.bind(*subfuns, *args, **bound)
    return prim.bind(*args, **bound)


def abstract_mesh(sizes, names):
    """A device-less mesh of these axis sizes and names with every axis Auto: 0.8 to 0.10's default, which 0.11 made
    Explicit (arguments then carry their sharding in their type, and shard_map refuses in_specs that type lacks)."""
    from jax.sharding import AbstractMesh, AxisType  # noqa: PLC0415

    return AbstractMesh(tuple(sizes), tuple(names), axis_types=(AxisType.Auto,) * len(names))


def keep_weak_type(out, x):
    """out, weakly typed where x is (a Python scalar's psum stays weak, as on 0.10; 0.8's collectives drop it)."""
    from jax._src.lax import lax as _lax  # noqa: PLC0415

    if jax.typeof(x).weak_type and not jax.typeof(out).weak_type and out.dtype == x.dtype:
        return _lax._convert_element_type(out, out.dtype, weak_type=True)
    return out


def pvary(x, axes):
    """x typed as varying over mesh `axes` (in a body JAX traces with check_vma=True)."""
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, axes, to="varying")
    return jax.lax.pvary(x, axes)


def _primitives(table):
    """{primitive: value} for the (module, attribute) names of `table` that the installed JAX has."""
    out = {}
    for names, value in table.items():
        for name in names.split():
            for module in (_parallel, _core):
                prim = getattr(module, name, None)
                if isinstance(prim, _core.Primitive):
                    out[prim] = value
                    break
    return out


# JAX's axis collectives -> the shardkit collective each is run as ("pvary": the identity on values; "axis_index":
# this rank's index, known when tracing).
AXIS_COLLECTIVES = _primitives({"psum_p psum_invariant_p": "psum", "pmax_p": "pmax", "pmin_p": "pmin",
                                "all_gather_p all_gather_invariant_p": "all_gather",
                                "reduce_scatter_p": "psum_scatter", "ppermute_p": "ppermute",
                                "all_to_all_p": "all_to_all", "pbroadcast_p": "pbroadcast", "pvary_p": "pvary",
                                "axis_index_p": "axis_index"})


def _call_primitives():
    from jax._src import ad_checkpoint, pjit  # noqa: PLC0415

    out = {}
    for module, name, param in ((pjit, "jit_p", "jaxpr"), (pjit, "pjit_p", "jaxpr"), (_core, "closed_call_p",
                                "call_jaxpr"), (_core, "call_p", "call_jaxpr"), (ad_checkpoint, "remat_p", "jaxpr")):
        prim = getattr(module, name, None)
        if isinstance(prim, _core.Primitive):
            out[prim] = param
    return out


# Primitives that call one jaxpr (the parameter that holds it), run inline in a traced body: jit, calls and remat.
INLINED_CALLS = _call_primitives()


def _custom_derivative_calls():
    from jax._src import custom_derivatives  # noqa: PLC0415

    out = {}
    for name, kind in (("custom_jvp_call_p", "jvp"), ("custom_vjp_call_p", "vjp"), ("custom_vjp_call_jaxpr_p", "vjp")):
        prim = getattr(custom_derivatives, name, None)
        if isinstance(prim, _core.Primitive):
            out[prim] = kind
    return out


# Calls of functions with custom derivative rules -> "jvp" (jax.custom_jvp) or "vjp" (jax.custom_vjp). Their
# equations hold the function's jaxpr (custom_call_jaxpr) and its rules as thunks that JAX traces in the context of
# the body (its types) when it differentiates the call: shardkit.jax._check_vma binds such an equation again inside a
# body JAX traces (bind_equation) to get the rules' jaxprs.
CUSTOM_DERIVATIVE_CALLS = _custom_derivative_calls()


def custom_call_jaxpr(params):
    """The ClosedJaxpr of the function a custom derivative call's equation calls (None where its parameters are not
    those of 0.8 to 0.10)."""
    for name in ("call_jaxpr", "fun_jaxpr"):
        if isinstance(params.get(name), _core.ClosedJaxpr):
            return params[name]
    return None


def custom_call_name(params):
    """The name of the function a custom derivative call's equation calls, for messages."""
    for v in (params.get("call_jaxpr"), params.get("fun_jaxpr"), params.get("jvp_jaxpr_fun"),
              params.get("fwd_jaxpr_thunk")):
        info = getattr(getattr(v, "jaxpr", v), "debug_info", None)
        if getattr(info, "func_name", None):
            return str(info.func_name)
    return str(params.get("name", "<unnamed>"))


def vma(aval):
    """The mesh axes a value of a body JAX traced with check_vma=True varies over (its type's vma: ``aval.vma`` where
    the type has it, as on 0.8; 0.10's ``aval.manual_axis_type.varying``)."""
    if hasattr(aval, "vma"):
        return frozenset(aval.vma)
    return frozenset(getattr(getattr(aval, "manual_axis_type", None), "varying", ()))


def ordered_effect(name):
    """An instance of a new effect type that JAX orders (one token chain, in program order), lowers, and allows in
    control flow, custom derivatives and remat."""
    cls = type(f"{name.capitalize()}Effect", (_effects.Effect,), {"__str__": lambda self: name})
    for effect_set in (_effects.lowerable_effects, _effects.ordered_effects, _effects.control_flow_allowed_effects,
                       _effects.custom_derivatives_allowed_effects, _effects.remat_allowed_effects):
        effect_set.add_type(cls)
    return cls()


def continue_after_failed_programs(effect, is_own_error):
    """Lets the token chain of `effect` go on past a compiled program that failed, as JAX's outputs do.

    JAX threads an ordered effect's token from one compiled program into the next (``RuntimeTokenSet``). Where a
    program fails after it was dispatched (XLA:GPU always, XLA:CPU for programs it runs asynchronously), the tokens it
    returned carry the error, and JAX keeps them: every later program with the effect blocks on its token and raises
    the same error, as do ``jax.effects_barrier()`` and JAX's exit handler, for the rest of the process
    (jax-ml/jax#37587, open in 0.8 to 0.11). The error belongs to the program that failed, and reaches its caller
    through that program's results; the chain then starts afresh, as it would have had the failure been synchronous.
    Dropped: a failed token of `effect`, and a failed token of any other ordered effect or a device's failed runtime
    token whose error ``is_own_error(message)`` claims (another program's error stays JAX's to report). Where the
    next program takes the token this is silent (the program's results raised it, or will); at a barrier or at exit,
    where nothing else may ever report it, each dropped error is also given as a RuntimeWarning."""
    tokens = getattr(_dispatch, "RuntimeTokenSet", None)
    if tokens is None or getattr(tokens, "_shardkit_continues", None) is effect:
        return
    assert getattr(tokens, "_shardkit_continues", None) is None, "one ordered effect per process goes on past failures"
    get_token_input, block_until_ready = tokens.get_token_input, tokens.block_until_ready

    def failure_message(token):
        # No wait JAX does not do too: it blocks on a token before handing it to the next program
        # (array._token_shard_arg), and a barrier blocks on every token.
        try:
            token.block_until_ready()
        except jax.errors.JaxRuntimeError as e:
            return str(e)
        return None

    def drop_failed(table, key, token, warn):
        message = failure_message(token)
        if message is not None and (key is effect or is_own_error(message)):
            del table[key]
            if warn:
                warnings.warn(f"a compiled program failed: {message}", RuntimeWarning, stacklevel=3)

    def get_token_input_continuing(self, eff, devices):
        token = self.current_tokens.get(eff)
        if isinstance(token, Token):
            drop_failed(self.current_tokens, eff, token, warn=False)
        return get_token_input(self, eff, devices)

    def block_until_ready_continuing(self):
        for table in (self.current_tokens, self.output_runtime_tokens):
            for key, token in list(table.items()):
                drop_failed(table, key, token, warn=True)
        block_until_ready(self)

    tokens.get_token_input = get_token_input_continuing
    tokens.block_until_ready = block_until_ready_continuing
    tokens._shardkit_continues = effect


def _takes_module_context(fn):
    try:
        return len(inspect.signature(fn).parameters) >= 2
    except (TypeError, ValueError):  # a builtin without a signature: 0.10's form is the newer one
        return True


if _takes_module_context(mlir.aval_to_ir_type):
    def aval_to_ir_type(ctx, aval):
        """The MLIR type of an abstract value, in a lowering rule whose context is `ctx`."""
        return mlir.aval_to_ir_type(ctx.module_context, aval)
else:
    def aval_to_ir_type(ctx, aval):
        """The MLIR type of an abstract value, in a lowering rule whose context is `ctx`."""
        return mlir.aval_to_ir_type(aval)


def user_context():
    """A context manager factory that jax.jit's caches are keyed on (jax.make_user_context), or None where JAX has
    none."""
    return jax.make_user_context(None) if hasattr(jax, "make_user_context") else None


def trace_probe():
    """(object, attribute, value, object, attribute, value): JAX is not tracing on this thread when both objects'
    attributes are these values (compared by identity, as trace_state_clean does), for the C++ side to read without
    a Python call; None where JAX keeps its trace state otherwise (the C++ side then calls trace_state_clean)."""
    # (This module may be loaded while JAX traces: the values are the top-level ones, not the current ones.)
    if hasattr(_core, "trace_state_strong_ref") and hasattr(_core, "axis_env_state"):  # 0.10: config states
        probe = (_core.trace_state_strong_ref, "value", _core.eval_trace,
                 _core.axis_env_state, "value", _core.top_axis_env)
    else:  # 0.8, 0.9: a threading.local TracingContext
        probe = (_core.trace_ctx, "trace", _core.eval_trace, _core.trace_ctx, "axis_env", _core.top_axis_env)
    try:
        for obj, attr in ((probe[0], probe[1]), (probe[3], probe[4])):
            getattr(obj, attr)  # readable, as the C++ side reads it
        # The probe and trace_state_clean agree here (both true at the top level, both false inside a trace).
        if (probe[2] is getattr(probe[0], probe[1]) and probe[5] is getattr(probe[3], probe[4])) != \
                trace_state_clean():
            return None
        return probe
    except AttributeError:
        return None


def host_importer():
    """jaxlib's DLPack importer and its arguments after the capsule, for eager results on the CPU device: what
    jax.dlpack.from_dlpack calls, without its Python layers (a result of an operation on jax.Arrays already has the
    dtype JAX made). (None, None) where jaxlib's function differs: results then go through jax.dlpack."""
    try:
        from jax._src.lib import _jax as _jaxlib  # noqa: PLC0415

        fn = _jaxlib.dlpack_managed_tensor_to_buffer
        device = jax.devices("cpu")[0]
    except Exception:  # noqa: BLE001  (any failure: keep the public path)
        return None, None
    # (capsule, device, stream, copy, dl_device_type) from 0.10 on, (capsule, device, stream, copy) before; kDLCPU = 1.
    for args in ((device, None, None, 1), (device, None, None)):
        try:
            expected = np.full(3, 7, np.float32)
            probe = fn(expected.__dlpack__(), *args)
            if (type(probe) is ArrayImpl and probe.devices() == {device} and probe.dtype == np.float32
                    and np.array_equal(np.asarray(probe), expected)):
                return fn, args
        except Exception:  # noqa: BLE001, S112  (this form is not the installed one: try the next)
            continue
    return None, None
