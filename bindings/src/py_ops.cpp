// The collectives in Python, bound once: one entry per operation (its Python parameters and docstring) from which both
// views are made, the shardkit.mpi function (mpi4jax's API: `comm=` names the communicator) and the Communicator
// method (the communicator is the object). Both run one body, call_op(), over the operation table of the C++ layer:
// the result shape comes from its value rule, the buffers from bind_value(), the run from Communicator::run().
// NumPy inputs get their results allocated by NumPy and filled in place; other frameworks go through the value form
// and come back through DLPack.

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

// The operation a cotangent runs through under JAX's transposition (nullptr: none, the operation is not linear there).
struct JaxTranspose {
  const char* mpi = nullptr;  // shardkit.mpi, as mpi4jax 0.7 defines it (allreduce's: the identity on each rank)
  const char* sm = nullptr;   // in a shard_map body, the exact transpose (JAX's psum -> psum, all_gather -> psum_scatter)
};

// One operation in Python: its parameters (the communicator aside), JAX facts and docstring.
struct PyOp {
  OpKind op;
  std::vector<Param> params;
  bool mpi4jax;  // also a shardkit.mpi function (mpi4jax has no reduce_scatter or allgatherv)
  JaxTranspose transpose;
  const char* doc;
};

using F = Field;
const std::vector<PyOp>& py_ops() {
  static const std::vector<PyOp> ops = {
      {OpKind::kAllreduce, {arg(F::kX), arg(F::kOp), kw(F::kToken, "None")}, true, {"allreduce", "allreduce"},
       "Returns (result, token). Reduces x over all ranks with op (mpi4py.MPI.SUM, ..., a name, or a shardkit "
       "ReduceOp); every rank gets the result."},
      {OpKind::kReduce, {arg(F::kX), arg(F::kOp), arg(F::kRoot), kw(F::kToken, "None")}, true, {},
       "Returns (result, token). On root, x reduced over all ranks with op; elsewhere x, unchanged."},
      {OpKind::kBcast, {arg(F::kX), arg(F::kRoot), kw(F::kToken, "None")}, true, {nullptr, "allreduce"},
       "Returns (result, token). Root's x on every rank, as a new array (x gives shape and dtype elsewhere and is "
       "never written)."},
      {OpKind::kAllgather, {arg(F::kX), kw(F::kToken, "None")}, true, {nullptr, "reduce_scatter"},
       "Returns (result, token). Every rank's x, stacked: shape (nproc, *x.shape). x must have the same shape and "
       "dtype on all ranks."},
      {OpKind::kGather, {arg(F::kX), arg(F::kRoot), kw(F::kToken, "None")}, true, {},
       "Returns (result, token). On root, every rank's x stacked: shape (nproc, *x.shape); elsewhere x, unchanged."},
      {OpKind::kScatter, {arg(F::kX), arg(F::kRoot), kw(F::kToken, "None")}, true, {},
       "Returns (result, token). Block r of root's x (shape (nproc, *s)) to rank r; elsewhere x gives the shape s "
       "(and is not read)."},
      {OpKind::kReduceScatter, {arg(F::kX), arg(F::kOp), kw(F::kToken, "None")}, false, {nullptr, "allgather"},
       "Returns (result, token). x has shape (nproc, *s); rank r gets block r of the reduction, shape s."},
      {OpKind::kAlltoall, {arg(F::kX), kw(F::kToken, "None")}, true, {nullptr, "alltoall"},
       "Returns (result, token). Block i of x (first axis, of size nproc) goes to rank i; block j of the result came "
       "from rank j."},
      {OpKind::kSend, {arg(F::kX), arg(F::kDest), kw(F::kTag, "0"), kw(F::kToken, "None")}, true, {},
       "Returns a token. Sends x to rank dest."},
      {OpKind::kRecv,
       {arg(F::kX), opt(F::kSource, "shardkit.mpi.ANY_SOURCE"), kw(F::kTag, "shardkit.mpi.ANY_TAG"), kw(F::kStatus, "None"),
        kw(F::kToken, "None")},
       true, {},
       "Returns (result, token). Receives a new array shaped like x (which is never written). status: an mpi4py "
       "Status to fill."},
      {OpKind::kSendrecv,
       {arg(F::kSendbuf), arg(F::kRecvbuf), arg(F::kSource), arg(F::kDest), kw(F::kSendtag, "0"),
        kw(F::kRecvtag, "shardkit.mpi.ANY_TAG"), kw(F::kStatus, "None"), kw(F::kToken, "None")},
       true, {"sendrecv", "sendrecv"},
       "Returns (result, token). Sends sendbuf to dest while receiving a new array shaped like recvbuf from source."},
      {OpKind::kBarrier, {kw(F::kToken, "None")}, true, {}, "Returns a token. Waits for every rank."},
      {OpKind::kScan, {arg(F::kX), arg(F::kOp), kw(F::kToken, "None")}, true, {},
       "Returns (result, token). Inclusive prefix: rank r gets op over ranks 0..r."},
      {OpKind::kAllgatherv, {arg(F::kX), kw(F::kToken, "None")}, false, {},
       "Returns (result, token). Every rank's x flattened and concatenated in rank order; lengths may differ."},
  };
  return ops;
}

// The parameters of the shardkit.mpi function: the method's, with comm=None before status and token (mpi4jax's order).
std::vector<Param> with_comm(const std::vector<Param>& params) {
  std::vector<Param> out;
  bool placed = false;
  for (const Param& p : params) {
    if (!placed && (p.field == F::kStatus || p.field == F::kToken)) {
      out.push_back(kw(F::kComm, "None"));
      placed = true;
    }
    out.push_back(p);
  }
  return out;
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

namespace {

// The body of every operation, for either view (JAX values were handed to shardkit._jax before it).
nb::object call_op(OpKind op, const FastArgs& a, Communicator& c) {
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

template <int I>
nb::object module_function(const FastArgs& a) {
  if (nb::object r; jax_dispatch(py_ops()[I].op, a, a.get(F::kComm), &r)) return r;  // JAX values: shardkit._jax
  CommPtr c = comm_from(a.get(F::kComm), op_name(py_ops()[I].op));
  return call_op(py_ops()[I].op, a, *c);
}

template <int I>
nb::object method(const FastArgs& a) {
  if (nb::object r; jax_dispatch(py_ops()[I].op, a, nb::handle(a.self), &r)) return r;
  return call_op(py_ops()[I].op, a, *nb::inst_ptr<Communicator>(nb::handle(a.self)));
}

template <int I>
void register_op(nb::module_& m, nb::handle comm_type) {
  const PyOp& d = py_ops()[I];
  const char* name = op_name(d.op);
  def_fast_method<method<I>>(comm_type, name, d.params, d.doc);
  if (d.mpi4jax) {
    static const std::string attr = std::string("mpi_") + name;
    def_fast<module_function<I>>(m, attr.c_str(), name, with_comm(d.params),
                                 (std::string(d.doc) + " comm defaults to a clone of COMM_WORLD.").c_str());
  }
}

template <int... I>
void register_all(nb::module_& m, nb::handle comm_type, std::integer_sequence<int, I...>) {
  (register_op<I>(m, comm_type), ...);
}

}  // namespace

namespace {

// Where jax.vmap puts the batch axis of an operation's input and result on a rank (the root or another): behind the
// leading axis that the value form splits into one block per rank, and at the new leading axis of a stacked result
// (0 where the split axis is dropped).
nb::tuple batch_axes(OpKind op, bool at_root) {
  const int root = 0, rank = at_root ? 0 : 1;
  const bool splits = value_splits_leading(op, rank, root);
  const int in = splits ? 1 : 0;
  const bool drops = splits && value_rule(op) != ValueRule::kSameShape;
  return nb::make_tuple(in, value_stacks(op, rank, root) ? 1 : drops ? 0 : in);
}

// Every operation's facts for the Python and JAX layers, read once by shardkit._jax: the table's (value rule, what it
// takes, batch axes) and the Python entry's (parameters, JAX transposes). Operations without a Python entry
// (alltoallv) have python=False.
nb::dict op_facts() {
  nb::dict out;
  for (int i = 0; i < kOpCount; ++i) {
    const auto op = static_cast<OpKind>(i);
    const OpTraits t = op_traits(op);
    nb::dict f;
    f["value"] = value_rule_name(value_rule(op));
    f["collective"] = t.collective;
    f["reduces"] = t.reduces;
    f["rooted"] = t.rooted;
    f["has_dest"] = t.has_dest;
    f["has_source"] = t.has_source;
    f["batch"] = nb::make_tuple(batch_axes(op, false), batch_axes(op, true));
    const PyOp* entry = nullptr;
    for (const PyOp& d : py_ops())
      if (d.op == op) entry = &d;
    f["python"] = entry != nullptr;
    f["mpi4jax"] = entry && entry->mpi4jax;
    nb::list params;
    if (entry)
      for (const Param& p : entry->params) params.append(field_name(p.field));
    f["params"] = params;
    auto name_or_none = [](const char* n) { return n ? nb::object(nb::str(n)) : nb::none(); };
    f["transpose"] = name_or_none(entry ? entry->transpose.mpi : nullptr);
    f["sm_transpose"] = name_or_none(entry ? entry->transpose.sm : nullptr);
    out[op_name(op)] = f;
  }
  return out;
}

}  // namespace

void register_ops(nb::module_& m) {
  SHARDKIT_ASSERT(static_cast<int>(py_ops().size()) == kOpCount - 1, "a Python entry for every operation but alltoallv");
  register_all(m, m.attr("Communicator"), std::make_integer_sequence<int, kOpCount - 1>{});
  m.def("_op_facts", &op_facts, "Every operation's facts (the operation table's and its Python entry's), by name.");
}

}  // namespace shardkit::py
