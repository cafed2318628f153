// The collectives in Python, bound once: one entry per operation (its Python parameters, JAX transposes and
// docstring) from which both views are made, the shardkit.mpi function (mpi4jax's API: `comm=` names the
// communicator) and the Communicator method (the communicator is the object). Both run one body, call_op()
// (py_ops.cpp). The entries and the operation table's facts are exported once to the Python and JAX layers
// (_core._op_facts).

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>
#include <vector>

#include "py_comm.hpp"
#include "py_fastcall.hpp"
#include "jax/jax_layer.hpp"
#include "shardkit/collectives/communicator.hpp"

namespace shardkit::py {
namespace {

using F = Field;

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

template <int I>
nb::object module_function(const FastArgs& a) {
  if (nb::object r; jax_dispatch(py_ops()[I].op, a, a.get(F::kComm), &r)) return r;  // JAX values: shardkit.jax._ops
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

// Every operation's facts for the Python and JAX layers, read once by shardkit.jax._ops: the table's (value rule, what
// it takes, batch axes) and the Python entry's (parameters, JAX transposes). Operations without a Python entry
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
