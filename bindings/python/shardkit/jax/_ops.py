"""shardkit's collectives as JAX primitives: inside jax.jit, vmap, grad, lax loops and custom_vjp.

Loaded with shardkit.jax once JAX is imported (shardkit never imports JAX itself), and connected to XLA and to the C++
side (activate) at its first use: the first time a shardkit.mpi function (or Communicator method) meets a JAX value,
or the JAX layer's entry points run (shardkit.jax/__init__.py). Every operation is one primitive,
``shardkit_collective``, whose parameters name the operation and its arguments; it lowers to the C++ XLA FFI handler
(bindings/src/jax/ffi_handlers.cpp), which runs the operation table's value form on XLA's buffers. Result shapes come
from the same table (``_core._value_shape``).

Ordering: the primitive carries an *ordered* effect, so JAX threads one token through every shardkit operation of a
program in program order: XLA neither reorders nor drops them, whether or not their results or tokens are used. The
``token=`` argument accepts shardkit tokens (waited for) and JAX tokens (ordering is already program order); inside a
trace the returned token is a JAX token. Eager calls on concrete arrays go back to the native path, which
returns shardkit tokens: jax.Arrays on the CPU come in through the buffer protocol (others through DLPack), and results
go back through jaxlib's DLPack importer without a copy, whatever token an eager call carries. Compiled programs run
on a duplicate of each communicator (``_core._jax_comm_handle``), so XLA's threads never match eager calls; an eager
call on device buffers first waits for the compiled programs dispatched before it (``_wait_for_compiled``), so that
XLA's thread and the caller's launch on NCCL in the same order on every rank.

Transformations follow mpi4jax 0.7: every operation batches under ``jax.vmap``; ``allreduce`` with ``op=SUM`` has a
JVP and a transpose (the transpose of the sum over ranks is the identity on each rank, as mpi4jax defines it), and
``sendrecv`` has a JVP and a transpose (the reverse exchange); other reductions and operations raise as mpi4jax does.
A shard_map body's collectives take their exact transposes (the derivative rules below).
"""

from __future__ import annotations

import atexit
import contextlib
import threading

import jax
import jax.numpy as jnp

from .. import _core
from . import _compat as jc
from ._compat import ad, batching, hlo, ir, mlir

__all__ = ["collective_p", "available", "bind", "activate"]


# The ordered side effect of every shardkit operation: one chain, in program order.
_effect = jc.ordered_effect("shardkit")

# The XLA FFI handlers (registered with XLA by activate).
_TARGETS = _core._jax_ffi_targets()
available = "shardkit_collective_cpu" in _TARGETS

_SUM = int(_core.ReduceOp.SUM)
# Every operation's facts, from the operation table and its Python entry (py_ops.cpp): value rule, what it takes, batch
# axes, transposes. The rules below look them up.
_FACTS = _core._op_facts()
_NO_VALUE = frozenset(op for op, f in _FACTS.items() if f["value"] == "none")  # the only result is the token
# Operations of shard_map bodies only (not in the operation table), all but the first the identity on values: a
# permutation along a mesh axis; "pvary", which marks a value that the ranks of `comm` hold alike where code that
# varies over them reads it (its cotangent is their sum: a psum over `comm`, as JAX's pvary transposes); and
# "replicated", which marks a value `root` ranks hold alike where the share rules take over (each rank's share of its
# cotangent is 1/root of it; comm -1: it communicates nothing).
_SAME_SHAPE = ("ppermute", "pvary", "replicated")
_IDENTITY = ("pvary", "replicated")

collective_p = jc.Primitive("shardkit_collective")
collective_p.multiple_results = True
collective_p.def_impl(lambda *args, **params: jc.apply_primitive(collective_p, *args, **params))


def bind(*args, op, comm, reduce=_SUM, root=0, dest=0, source=-1, send_tag=0, recv_tag=-1, transpose=False,
         sm=False, status=0, site=0, peers=0):
    """Binds the primitive: ``args`` are x (and sendbuf for sendrecv); returns the list of results. ``sm``: a
    collective of a shard_map body (shardkit.jax._shard_map), with the exact transposes of the derivative rules; the
    shard_map-only operation "ppermute" sends to ``dest`` and receives from ``source`` (-1: not); ``status``: the
    address of an MPI_Status (an mpi4py Status) the handler fills when the receive completes, as mpi4jax does, or 0;
    ``site``: the traced call's file and line as _core's call-site id (0: none), for the flight recorder; ``peers``:
    what the other ranks of a ppermute run (shardkit::Peers, the plan's), which decides whether it may take shm."""
    return collective_p.bind(*args, op=op, comm=comm, reduce=reduce, root=root, dest=dest, source=source,
                             send_tag=send_tag, recv_tag=recv_tag, transpose=transpose, sm=sm,
                             status=status, site=site, peers=peers)


def _out_shape(op, shape, comm, root):
    rank, size = _core._jax_comm_info(comm)
    return tuple(_core._value_shape(op, list(shape), rank, size, root))


def _abstract_eval(*args, op, comm, root, transpose, **_):
    if op in _NO_VALUE:
        return (), {_effect}
    x = args[0]
    shape = x.shape if transpose or op in _SAME_SHAPE else _out_shape(op, x.shape, comm, root)
    return (jc.ShapedArray(shape, x.dtype, weak_type=x.weak_type),), {_effect}  # a Python scalar stays weakly typed


collective_p.def_effectful_abstract_eval(_abstract_eval)


def _layout(aval):
    return tuple(range(len(aval.shape) - 1, -1, -1))


def _lowering(target):
    def custom_call(ctx, op, args, avals_in, avals_out, comm, reduce=_SUM, root=0, dest=0, source=-1, send_tag=0,
                    recv_tag=-1, status=0, site=0, peers=0):
        token = ctx.tokens_in.get(_effect)
        result_types = [hlo.TokenType.get()] + [jc.aval_to_ir_type(ctx, a) for a in avals_out]
        # One array attribute in the handler's order (ffi_handlers.cpp's Attrs): XLA decodes attributes by name at
        # every call.
        attrs = {"call": ir.DenseI64ArrayAttr.get([_core._op_code(op), int(comm), int(reduce), int(root), int(dest),
                                                   int(source), int(send_tag), int(recv_tag), int(status),
                                                   int(site), int(peers)])}
        call = mlir.custom_call(
            target, result_types=result_types, operands=[token, *args], backend_config=attrs, api_version=4,
            has_side_effect=True, operand_layouts=[()] + [_layout(a) for a in avals_in],
            result_layouts=[()] + [_layout(a) for a in avals_out])
        ctx.set_tokens_out(mlir.TokenSet({_effect: call.results[0]}))
        return list(call.results[1:])

    def rule(ctx, *args, op, comm, transpose, sm, **p):
        if transpose or op in _IDENTITY:  # allreduce's transpose in mpi4jax's convention; the marks
            ctx.set_tokens_out(ctx.tokens_in)
            return [args[0]]
        if op == "ppermute":  # this rank's exchange (shardkit::exchange_op): sendrecv, send, recv, or nothing
            (x,), (aval,) = args, ctx.avals_in
            exchange = _core._exchange_op(p["dest"], p["source"])
            q = {k: p[k] for k in ("dest", "source", "send_tag", "recv_tag", "site", "peers")}
            if exchange == "sendrecv":
                return custom_call(ctx, exchange, [x, x], [aval, aval], [aval], comm, **q)
            if exchange == "recv":
                return custom_call(ctx, exchange, [x], [aval], [aval], comm, **q)
            if exchange == "send":
                custom_call(ctx, exchange, [x], [aval], [], comm, **q)
            else:
                ctx.set_tokens_out(ctx.tokens_in)
            return [mlir.full_like_aval(ctx, 0, aval)]
        return custom_call(ctx, op, args, ctx.avals_in, ctx.avals_out, comm, **p)
    return rule


if available:
    mlir.register_lowering(collective_p, _lowering("shardkit_collective_cpu"), platform="cpu")
if "shardkit_collective_cuda" in _TARGETS:
    mlir.register_lowering(collective_p, _lowering("shardkit_collective_cuda"), platform="cuda")


# ---- vmap -----------------------------------------------------------------------------------------------------------

def _batch_rule(args, dims, *, op, comm, root, **params):
    facts = _FACTS.get(op)  # None: the shard_map-only operations, which keep x's shape
    # The rank matters to the rooted operations only (the "replicated" mark names no communicator).
    at_root = facts is not None and facts["rooted"] and _core._jax_comm_info(comm)[0] == root
    # Where the batch axis goes in x (behind a leading axis the value form splits per rank) and in the result.
    pos, out_dim = facts["batch"][at_root] if facts else (0, 0)
    if pos:  # the shape rule on one example (its nproc axis), before the batch axis goes behind that axis
        x, d = args[0], dims[0]
        _out_shape(op, x.shape if d is None else x.shape[:d] + x.shape[d + 1:], comm, root)
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    moved = []
    for a, d in zip(args, dims):
        if d is None:
            a = jnp.broadcast_to(jnp.expand_dims(a, pos), a.shape[:pos] + (size,) + a.shape[pos:])
        else:
            a = batching.moveaxis(a, d, pos)
        moved.append(a)
    out = bind(*moved, op=op, comm=comm, root=root, **params)
    if op in _NO_VALUE:
        return out, []
    return out, [out_dim]


batching.primitive_batchers[collective_p] = _batch_rule


# ---- jvp and transpose -----------------------------------------------------------------------------------------------
# shardkit.mpi's operations follow mpi4jax 0.7: allreduce with SUM (its transpose the identity on each rank, as mpi4jax
# defines it) and sendrecv (the reverse exchange); the rest raise as mpi4jax does.
# A shard_map body's collectives (sm=True) take their exact transposes, as jax.pmap's do: psum's is psum, all_gather's
# psum_scatter and back, pbroadcast's a psum kept at the source, all_to_all's all_to_all, ppermute's the inverse
# permutation: inside a body each rank's cotangent of a value is its share, and their sum over the ranks that hold the
# value alike is its cotangent. The traced shard_map (shardkit.jax._shard_map) turns shares into cotangents at its
# boundary, as jax.shard_map's transpose does: an output block that k ranks hold alike (its out_spec names no axis
# among theirs) is marked "replicated" (each rank's share of its cotangent is 1/k of it), and an argument block that
# ranks hold alike is marked "pvary" over them (its cotangent is the psum of their shares). Outside bodies every rank
# holding a block holds its whole cotangent, so the gradient with respect to a ShardedArray is, on each rank, its block
# of the gradient of the global function.

def _partner(op, sm):
    """The operation op's cotangent runs through (the table's transposes; the shard_map-only operations are their own
    partners), or None where op is not linear in this mode."""
    facts = _FACTS.get(op)
    if facts is None:
        return op
    return facts["sm_transpose" if sm else "transpose"]


def _no_derivative(op, reduce, sm, what):
    """The error for a reduction other than sum, naming what the caller called: pmax/pmin in a shard_map body (as
    JAX's primitives do), mpi4jax's text for shardkit.mpi."""
    if sm:
        name = "psum_scatter" if op == "reduce_scatter" else "p" + _core.ReduceOp(reduce).name.lower()
        return NotImplementedError(f"Differentiation rule for '{name}' not implemented (only psum and psum_scatter "
                                   f"have derivatives, as in JAX)")
    return NotImplementedError(f"The {what} of {op} is only defined for op=MPI.SUM")


def _check_linear(op, reduce, sm, what):
    if _partner(op, sm) is None:
        raise NotImplementedError(f"{what} rule for '{op}' (shardkit) not implemented")
    if op in _FACTS and _FACTS[op]["reduces"] and reduce != _SUM:
        raise _no_derivative(op, reduce, sm, "adjoint" if what == "Differentiation" else "linear transpose")


def _jvp_rule(primals, tangents, *, op, reduce, **params):
    _check_linear(op, reduce, params["sm"], "Differentiation")
    if op == "sendrecv":
        # sendrecv(sendbuf, recvbuf): linear in sendbuf; recvbuf only gives shape and dtype.
        out = bind(*primals, op=op, reduce=reduce, **params)
        tan = bind(primals[0], ad.instantiate_zeros(tangents[1]), op=op, reduce=reduce, **params)
        return out, tan
    out = bind(*primals, op=op, reduce=reduce, **params)
    tan = bind(ad.instantiate_zeros(tangents[0]), op=op, reduce=reduce, **params)
    return out, tan


def _transpose_rule(cts, *args, op, reduce, transpose, **params):
    ct = ad.instantiate_zeros(cts[0])
    sm = params["sm"]
    _check_linear(op, reduce, sm, "Transpose")
    if op == "replicated":  # this rank's share of the cotangent of a value `root` ranks hold
        return [ct / params["root"]]
    if op == "pvary":  # the cotangent of a value the ranks of comm hold alike: the sum of their shares
        (res,) = bind(ct, op="allreduce", reduce=_SUM, transpose=transpose, **params)
        return [res]
    if op == "ppermute":  # the inverse permutation: receive from where this rank sent, send to where it received from
        p = dict(params, dest=params["source"], source=params["dest"])
        (res,) = bind(ct, op=op, reduce=reduce, transpose=transpose, **p)
        return [res]
    if op == "sendrecv":
        recv_like, send = args
        if params["source"] < 0:
            raise NotImplementedError("The linear transpose of sendrecv needs a definite source (not ANY_SOURCE)")
        aval = send.aval if ad.is_undefined_primal(send) else jax.typeof(send)
        like = jnp.zeros(aval.shape, aval.dtype)
        # The reverse exchange: the cotangent goes back to `source` with the tag the value came with, and comes from
        # `dest` with the tag this rank sent. Received with ANY_TAG, the value's tag is unknown here: this rank's
        # own send tag stands for it, as in mpi4jax (every rank of an SPMD program sends with the same tag).
        back_tag = params["recv_tag"] if params["recv_tag"] != _core.ANY_TAG else params["send_tag"]
        p = dict(params, source=params["dest"], dest=params["source"], send_tag=back_tag, recv_tag=params["send_tag"],
                 status=0)
        (res,) = bind(like, ct, op=op, reduce=reduce, transpose=transpose, **p)
        return [None, res]
    if op == "allreduce" and not sm:  # mpi4jax's transpose of a sum over ranks: the identity, lowered as `transpose`
        (res,) = bind(ct, op=op, reduce=reduce, transpose=not transpose, **params)
        return [res]
    (res,) = bind(ct, op=_partner(op, sm), reduce=_SUM, transpose=transpose, **params)
    if op == "bcast" and _core._jax_comm_info(params["comm"])[0] != params["root"]:
        res = jnp.zeros_like(res)  # only the source's value was used
    return [res]


ad.primitive_jvps[collective_p] = _jvp_rule
ad.primitive_transposes[collective_p] = _transpose_rule


# ---- the mesh of a shard_map body, in jax.jit's cache key -----------------------------------------------------------

# A jit-compiled function called in a shard_map body resolves its axis names to that mesh's communicators when it is
# traced; its compiled program names them. jax.jit keys its caches on this context, set to the mesh while a body runs
# (or is traced), so a trace made under one mesh never serves another. Equal meshes (same shape, names, device order
# and communicator) share traces: the first one's axis communicators, over the same ranks, serve both. (Made by
# activate: jax.make_user_context.)
_mesh_context = None


def mesh_key(mesh):
    """A context manager under which jax.jit's caches are those of `mesh`'s shard_map bodies (once activated)."""
    return _mesh_context(mesh) if _mesh_context is not None else contextlib.nullcontext()


# ---- shardkit.mpi's calls with JAX values ---------------------------------------------------------------------------

_default_handle = []


def comm_handle(comm, op=None):
    """The registry handle of a communicator argument (None: the default clone of COMM_WORLD), for operation `op` (None:
    a collective): point-to-point operations on an mpi4py communicator need no other rank to register it."""
    if comm is None:
        if not _default_handle:
            _default_handle.append(_core._jax_comm_handle(None))
        return _default_handle[0]
    return _core._jax_comm_handle(comm, op)


def _is_tracing():
    return not jc.trace_state_clean()


def _accept_token(token):
    if token is None or isinstance(token, (jc.Token, jc.Tracer)):
        return  # JAX tokens: ordering is program order already
    if isinstance(token, _core.Token):
        token.wait()
        return
    raise TypeError(f"token must be a shardkit Token, a JAX token or None, not {type(token).__name__}")


def dispatch(name, operands, params, status, token, comm):
    """shardkit._core's hook: runs shardkit.mpi function `name` on JAX values, bound by the native path's one step
    (``operands``: x, or sendrecv's receive template and send buffer; ``params``: the primitive's reduce, root, dest,
    source, send_tag and recv_tag, with mpi4py's wildcards as shardkit's)."""
    if not _is_tracing():
        # Eager calls on concrete arrays, with or without a token: the native path, on the communicator itself (the
        # C++ side sends them there before calling this).
        return NotImplemented
    _accept_token(token)
    h = comm_handle(comm, name)
    args = tuple(jnp.asarray(a) for a in operands)
    # The operation table's checks, with the eager call's messages, now: inside a compiled program the handler's
    # InvalidArgument would reach the caller as a JaxRuntimeError, after the program started.
    _core._check_value(name, comm, [(list(a.shape), a.dtype.name) for a in args], params)
    p = dict(params, op=name, comm=h)
    if status is not None:
        p["status"] = _status_address(status)
    try:
        out = bind(*args, **p)  # runs now under a transformation outside jax.jit (vmap of concrete arrays)
    except jax.errors.JaxRuntimeError as e:  # the handler's shardkit error, raised again as its class
        raise _translate(e) from None
    token = jax.lax.create_token()
    if name in _NO_VALUE:
        return token
    return out[0], token


# Statuses given to traced receives: kept alive for the life of the process, since compiled programs write into them
# each time they run (mpi4jax leaves that to the caller).
_statuses = []


def _status_address(status):
    """The address of an mpi4py Status's MPI_Status, which the compiled receive fills when it runs (mpi4jax's rule)."""
    from mpi4py import MPI  # noqa: PLC0415  (a Status was given: mpi4py is loaded)

    if not isinstance(status, MPI.Status):
        raise TypeError(f"status must be an mpi4py MPI.Status, not {type(status).__name__}")
    if not any(s is status for s in _statuses):
        _statuses.append(status)
    return MPI._addressof(status)


def _error_in(msg):
    """The shardkit exception an error message of a handler stands for: the message holds "shardkit.<class>: " with a
    class of the error table (_core._error_classes()); None for any other message."""
    for name, cls in _core._error_classes().items():
        tag = f"shardkit.{name}: "
        if tag in msg:
            return cls(msg[msg.index(tag) + len(tag):])
    return None


def _translate(e):
    """The shardkit exception a handler's error stands for (_error_in); any other error is returned as it is."""
    own = _error_in(str(e))
    return e if own is None else own


def _wait_for_compiled():
    """What an eager call on device buffers runs before its NCCL launch (collectives/launch_fence.hpp): the compiled
    programs dispatched before it run on XLA's thread, on the duplicate communicators' NCCL communicators, and two
    threads launching on two NCCL communicators of one device in an order that differs between ranks may hang NCCL.
    Waiting for them puts every rank's launches in program order."""
    jax.effects_barrier()


# ---- connecting the layer --------------------------------------------------------------------------------------------

_active = False
_activating = threading.Lock()


def activate():
    """Connects the layer to XLA and to shardkit's C++ side, once: at its first use (the C++ side calls this the first
    time a shardkit function meets a JAX value or token with JAX loaded; shardkit.jax's entry points call it before
    they run). Not when the layer is loaded, at ``import jax``: finding jaxlib's DLPack importer starts JAX's CPU
    backend, which a program may still be configuring then (jax.distributed.initialize, jax_platforms)."""
    global _active, _mesh_context
    if _active:
        return
    with _activating:
        if _active:
            return
        # A compiled program whose shardkit operation failed reports it through its results (blocking on them raises
        # it); the programs after it go on, and a barrier or exit that finds its failed token warns (JAX alone would
        # fail each of them with the same error).
        jc.continue_after_failed_programs(_effect, lambda message: _error_in(message) is not None)
        for name, capsule in _TARGETS.items():
            # XLA's platform names: "cpu" and "CUDA". A target registered for "cuda" is never found by jaxlib's CUDA
            # plugin (seen with jax 0.11.2 on an H200: "No FFI handler registered for shardkit_collective_cuda on a
            # platform CUDA").
            jax.ffi.register_ffi_target(name, capsule, platform="CUDA" if name.endswith("_cuda") else "cpu")
        _mesh_context = jc.user_context()
        # Compiled programs and trace caches hold the functions traced, and through them meshes and communicators: let
        # them go while shardkit can still free communicators (before MPI_Finalize and nanobind's shutdown).
        atexit.register(jax.clear_caches)
        _core._set_nccl_launch_fence(_wait_for_compiled)
        atexit.register(_core._set_nccl_launch_fence, None)
        # shardkit._core's entry into this module, with what it reads of JAX without a Python call (shardkit.jax._compat
        # finds each for the installed JAX).
        _core._set_jax_hook(dispatch, jc.ArrayImpl, jc.Tracer, jc.Token, jc.trace_state_clean, jc.trace_probe(),
                            *jc.host_importer())
        _active = True
