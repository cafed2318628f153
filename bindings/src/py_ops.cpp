// Python calls of the collectives, converted: reductions, tokens and statuses from Python, one call's operands and
// arguments bound once (bind_call: the native path and the JAX layer's), and the body every view runs (call_op) over
// the C++ operation table: the result shape comes from its value rule, the buffers from bind_value(), the run from
// Communicator::run(). NumPy inputs get their results allocated by NumPy and filled in place; other frameworks go
// through the value form and come back through DLPack. The views themselves are registered in bind_ops.cpp.

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>
#include <vector>

#include "py_array.hpp"
#include "py_comm.hpp"
#include "py_fastcall.hpp"
#include "jax/jax_layer.hpp"
#include "shardkit/collectives/communicator.hpp"

namespace shardkit::py {

using F = Field;

ReduceOp reduce_op_of(nb::handle op) {
  if (PyLong_Check(op.ptr())) {  // ReduceOp members are ints too
    const long v = PyLong_AsLong(op.ptr());
    SHARDKIT_CHECK(v >= 0 && v < kReduceOpCount, "unknown reduction ", v);
    return static_cast<ReduceOp>(v);
  }
  if (const Mpi4py* api = mpi4py_api())
    if (auto it = api->ops.find(op.ptr()); it != api->ops.end()) return it->second;
  if (nb::isinstance<nb::str>(op)) return reduce_op_from_name(nb::cast<std::string>(op));
  nb::object mod = nb::getattr(op.type(), "__module__", nb::none());
  if (nb::isinstance<nb::str>(mod) && nb::cast<std::string>(mod) == "mpi4py.MPI")
    throw InvalidArgument(std::string("mpi4py operation ") + nb::cast<std::string>(nb::repr(op)) +
                          " has no shardkit equivalent (" + reduce_op_names(/*upper_case=*/true) + ")");
  throw InvalidArgument(std::string("op must be an mpi4py operation, a name or a shardkit ReduceOp, not ") +
                        nb::type_name(op.type()).c_str());
}

Token token_of(nb::handle t) {
  // A JAX token outside any trace orders nothing more than program order (JAX's eager calls run in it).
  if (t.is_none() || jax_token(t)) return Token();
  if (!nb::isinstance<Token>(t))
    throw nb::type_error(("token must be a shardkit Token, a JAX token or None, not " +
                          std::string(nb::type_name(t.type()).c_str())).c_str());
  return nb::cast<Token>(t);
}

namespace {

// Runs `op` (its buffers bound in `args`) on NumPy memory that the caller's objects hold, complete on return.
void run_on_numpy(Communicator& c, OpKind op, OpArgs& args, Token& token, nb::handle x, nb::handle result, bool owned) {
  try {
    nb::gil_scoped_release release;
    token = c.run(op, args, token);
    token.wait();  // NumPy reads the memory right away
  } catch (const InvalidArgument&) {
    throw;  // raised before anything was sent (as MismatchError is)
  } catch (const MismatchError&) {
    throw;
  } catch (...) {
    // A failure after requests were posted: MPI may still use the memory, which the Arrays do not own here.
    if (!owned) {
      result.inc_ref();
      x.inc_ref();
    }
    throw;
  }
}

}  // namespace

nb::object value_py(Communicator& c, OpKind op, nb::handle x, OpArgs& args, Token& token, bool jax_result) {
  const int rank = c.rank();
  if (value_rule(op) != ValueRule::kConcat && !jax_result) {
    const bool owned = !completes_in_call(c);
    if (std::optional<Array> a = numpy_input(x, owned)) {
      if (value_is_input(op, rank, args.root)) {
        args.send = &*a;
        run_on_numpy(c, op, args, token, x, x, owned);
        return nb::borrow(x);
      }
      nb::object result;
      Array out = numpy_empty(value_shape(op, a->shape(), rank, c.size(), args.root), a->dtype(), &result, owned);
      bind_value(op, *a, out, args, rank);
      run_on_numpy(c, op, args, token, x, result, owned);
      return result;
    }
  }
  Framework fw;
  Array a = array_from_py(x, &fw);
  if (jax_result) fw = Framework::kJax;
  std::optional<Result> r;  // not default-constructed: an empty Array allocates
  {
    nb::gil_scoped_release release;
    r.emplace(c.run_value(op, a, args, token));
  }
  token = r->token;
  if (fw == Framework::kJax) {
    // As for NumPy: where the value is the input, the caller gets its own array back (JAX arrays are immutable).
    if (value_is_input(op, rank, args.root) && is_jax_array(x)) {
      token.wait();
      return nb::borrow(x);
    }
    if (nb::object j = jax_host_result(r->value); j.is_valid()) return j;
  }
  return array_to_py(std::move(r->value), fw);
}

namespace {

// mpi4py's ANY_SOURCE / ANY_TAG (-1 in Open MPI and MPICH alike, but taken from mpi4py) as shardkit's.
int source_of(int s) {
  const Mpi4py* api = mpi4py_api();
  return api && s == api->any_source ? kAnySource : s;
}
int tag_of(int t) {
  const Mpi4py* api = mpi4py_api();
  return api && t == api->any_tag ? kAnyTag : t;
}

// Writes what a receive matched into an mpi4py Status.
void fill_status(nb::handle status, const RecvStatus& st, DType dtype) {
  if (status.is_none()) return;
  status.attr("Set_source")(st.source);
  status.attr("Set_tag")(st.tag);
  try {
    nb::object dtlib = nb::module_::import_("mpi4py.util.dtlib");
    nb::object npdtype = nb::module_::import_("numpy").attr("dtype")(std::string(dtype_name(dtype)));
    status.attr("Set_elements")(dtlib.attr("from_numpy_dtype")(npdtype), st.count);
  } catch (nb::python_error&) {
    // dtypes without an MPI equivalent (bfloat16): source and tag are set
  }
}

}  // namespace


BoundCall bind_call(OpKind op, const FastArgs& a) {
  BoundCall b;
  OpArgs& args = b.args;
  if (a.get(F::kOp).ptr() != Py_None) args.reduce = reduce_op_of(a.get(F::kOp));
  args.root = a.get_int(F::kRoot, 0);
  args.dest = a.get_int(F::kDest, 0);
  args.source = source_of(a.get_int(F::kSource, kAnySource));
  args.send_tag = a.get_int(F::kSendtag, a.get_int(F::kTag, 0));
  args.recv_tag = tag_of(a.get_int(F::kRecvtag, a.get_int(F::kTag, kAnyTag)));
  b.x = a.get(op == OpKind::kSendrecv ? F::kRecvbuf : F::kX);
  if (op == OpKind::kSendrecv) b.sendbuf = a.get(F::kSendbuf);
  b.status = a.get(F::kStatus);
  b.token = a.get(F::kToken);
  return b;
}

// The body of every operation, for either view (JAX values were handed to shardkit.jax._ops before it).
nb::object call_op(OpKind op, const FastArgs& a, Communicator& c) {
  note_call_site();
  BoundCall b = bind_call(op, a);
  OpArgs& args = b.args;
  Token token = token_of(b.token);
  RecvStatus status;
  if (!b.status.is_none()) args.status = &status;

  if (op == OpKind::kBarrier || op == OpKind::kSend) {
    std::optional<Array> x;
    if (op == OpKind::kSend) args.send = &x.emplace(array_from_py(b.x));
    {
      nb::gil_scoped_release release;
      token = c.run(op, args, token);
    }
    return token_object(token);
  }
  std::optional<Array> send;
  bool jax_result = false;
  if (op == OpKind::kSendrecv) {
    args.send = &send.emplace(array_from_py(b.sendbuf));
    // As mpi4jax: a JAX array sent gives a JAX array received, whatever the receive template is.
    jax_result = is_jax_array(b.sendbuf) && !is_jax_array(b.x);
  }
  nb::object result = value_py(c, op, b.x, args, token, jax_result);
  if (args.status) fill_status(b.status, status, array_from_py(b.x).dtype());
  return nb::make_tuple(result, token_object(token));
}

}  // namespace shardkit::py
