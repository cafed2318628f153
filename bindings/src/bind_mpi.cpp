// shardkit.mpi: the mpi4jax API, implemented here rather than in Python so that a call costs no more than mpi4py's
// buffer calls (each Python frame, enum conversion or extra allocation shows at small sizes). NumPy inputs get
// their results allocated by NumPy (its small-array cache) and filled in place through the buffer forms; other
// frameworks go through the value forms and come back through DLPack.

#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include <unordered_map>

#include "py_array.hpp"
#include "py_comm.hpp"
#include "py_fastcall.hpp"
#include "shardkit/collectives/communicator.hpp"

namespace shardkit::py {
namespace {

// ---- arguments ---------------------------------------------------------------------------------------------------------

ReduceOp reduce_op_of(nb::handle op) {
  if (PyLong_Check(op.ptr())) {  // ReduceOp members are ints too
    const long v = PyLong_AsLong(op.ptr());
    SHARDKIT_CHECK(v >= 0 && v <= static_cast<long>(ReduceOp::kBitXor), "unknown reduction ", v);
    return static_cast<ReduceOp>(v);
  }
  if (const Mpi4py* api = mpi4py_api())
    if (auto it = api->ops.find(op.ptr()); it != api->ops.end()) return it->second;
  if (nb::isinstance<nb::str>(op)) {
    static const std::unordered_map<std::string, ReduceOp> by_name = {
        {"sum", ReduceOp::kSum},        {"prod", ReduceOp::kProd},     {"min", ReduceOp::kMin},
        {"max", ReduceOp::kMax},        {"land", ReduceOp::kLogicalAnd}, {"lor", ReduceOp::kLogicalOr},
        {"lxor", ReduceOp::kLogicalXor}, {"band", ReduceOp::kBitAnd},   {"bor", ReduceOp::kBitOr},
        {"bxor", ReduceOp::kBitXor}};
    std::string name = nb::cast<std::string>(op);
    for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (auto it = by_name.find(name); it != by_name.end()) return it->second;
    throw InvalidArgument("unknown reduction '" + name + "' (sum, prod, min, max, land, lor, lxor, band, bor, bxor)");
  }
  nb::object mod = nb::getattr(op.type(), "__module__", nb::none());
  if (nb::isinstance<nb::str>(mod) && nb::cast<std::string>(mod) == "mpi4py.MPI")
    throw InvalidArgument(std::string("mpi4py operation ") + nb::cast<std::string>(nb::repr(op)) +
                          " has no shardkit equivalent (SUM, PROD, MIN, MAX, LAND, LOR, LXOR, BAND, BOR, BXOR)");
  throw InvalidArgument(std::string("op must be an mpi4py operation, a name or a shardkit ReduceOp, not ") +
                        nb::type_name(op.type()).c_str());
}

// mpi4py's ANY_SOURCE / ANY_TAG (-1 in Open MPI and MPICH alike, but taken from mpi4py) as shardkit's.
int source_of(int s) {
  const Mpi4py* api = mpi4py_api();
  return api && s == api->any_source ? kAnySource : s;
}
int tag_of(int t) {
  const Mpi4py* api = mpi4py_api();
  return api && t == api->any_tag ? kAnyTag : t;
}

Token tok(nb::handle t) {
  if (t.is_none()) return Token();
  if (!nb::isinstance<Token>(t))
    throw nb::type_error(("token must be a shardkit Token or None, not " +
                          std::string(nb::type_name(t.type()).c_str())).c_str());
  return nb::cast<Token>(t);
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

// ---- calls -----------------------------------------------------------------------------------------------------------


// ---- the functions ---------------------------------------------------------------------------------------------------
// Each takes its arguments in the order of its signature (below, in register_mpi).

nb::object mpi_allreduce(const FastArgs& a) {  // (x, op, *, comm=None, token=None)
  CommPtr c = comm_from(a.get(2));
  const ReduceOp o = reduce_op_of(a.get(1));
  const Token t = tok(a.get(3));
  return call(*c, a.get(0), same_shape, [&](const Array& x, Array& out) { return c->allreduce(x, out, o, t); },
              [&](const Array& x) { return c->allreduce(x, o, t); });
}

nb::object mpi_allgather(const FastArgs& a) {  // (x, *, comm=None, token=None)
  CommPtr c = comm_from(a.get(1));
  const Token t = tok(a.get(2));
  return call(*c, a.get(0), [&](const Array& x) { return stacked(c->size(), x.shape()); },
              [&](const Array& x, Array& out) { return c->allgather(x, out, t); },
              [&](const Array& x) { return c->allgather(x, t); });
}

nb::object mpi_alltoall(const FastArgs& a) {  // (x, *, comm=None, token=None)
  CommPtr c = comm_from(a.get(1));
  const Token t = tok(a.get(2));
  return value_call(a.get(0), [&](const Array& x) { return c->alltoall(x, t); });
}

nb::object mpi_barrier(const FastArgs& a) {  // (*, comm=None, token=None)
  CommPtr c = comm_from(a.get(0));
  const Token t = tok(a.get(1));
  Token r;
  {
    nb::gil_scoped_release release;
    r = c->barrier(t);
  }
  return token_object(r);
}

// bcast, gather and scatter: (x, root, *, comm=None, token=None), through the value form.
template <Result (Communicator::*Op)(const Array&, int, const Token&)>
nb::object rooted(const FastArgs& a) {
  const int root = a.get_int(1);
  CommPtr c = comm_from(a.get(2));
  const Token t = tok(a.get(3));
  return value_call(a.get(0), [&](const Array& x) { return ((*c).*Op)(x, root, t); });
}

nb::object mpi_reduce(const FastArgs& a) {  // (x, op, root, *, comm=None, token=None)
  const ReduceOp o = reduce_op_of(a.get(1));
  const int root = a.get_int(2);
  CommPtr c = comm_from(a.get(3));
  const Token t = tok(a.get(4));
  return value_call(a.get(0), [&](const Array& x) { return c->reduce(x, o, root, t); });
}

nb::object mpi_scan(const FastArgs& a) {  // (x, op, *, comm=None, token=None)
  CommPtr c = comm_from(a.get(2));
  const ReduceOp o = reduce_op_of(a.get(1));
  const Token t = tok(a.get(3));
  return call(*c, a.get(0), same_shape, [&](const Array& x, Array& out) { return c->scan(x, out, o, t); },
              [&](const Array& x) { return c->scan(x, o, t); });
}

nb::object mpi_send(const FastArgs& a) {  // (x, dest, *, tag=0, comm=None, token=None)
  const int dest = a.get_int(1), tag = a.get_int(2, 0);
  CommPtr c = comm_from(a.get(3));
  const Token t = tok(a.get(4));
  Array x = array_from_py(a.get(0));
  Token r;
  {
    nb::gil_scoped_release release;
    r = c->send(x, dest, tag, t);
  }
  return token_object(r);
}

nb::object mpi_recv(const FastArgs& a) {  // (x, source=ANY_SOURCE, *, tag=ANY_TAG, comm=None, status=None, token=None)
  const int s = source_of(a.get_int(1, kAnySource)), g = tag_of(a.get_int(2, kAnyTag));
  CommPtr c = comm_from(a.get(3));
  const Token t = tok(a.get(5));
  RecvStatus st;
  DType dt = DType::kFloat32;
  nb::tuple r = call(*c, a.get(0), same_shape,
                     [&](const Array& like, Array& out) {
                       dt = like.dtype();
                       return c->recv_into(out, s, g, &st, t);
                     },
                     [&](const Array& like) {
                       dt = like.dtype();
                       return c->recv(like, s, g, &st, t);
                     });
  fill_status(a.get(4), st, dt);
  return r;
}

// (sendbuf, recvbuf, source, dest, *, sendtag=0, recvtag=ANY_TAG, comm=None, status=None, token=None)
nb::object mpi_sendrecv(const FastArgs& a) {
  const int s = source_of(a.get_int(2)), dest = a.get_int(3);
  const int sendtag = a.get_int(4, 0), g = tag_of(a.get_int(5, kAnyTag));
  CommPtr c = comm_from(a.get(6));
  const Token t = tok(a.get(8));
  Array send = array_from_py(a.get(0));
  RecvStatus st;
  DType dt = DType::kFloat32;
  nb::tuple r = call(*c, a.get(1), same_shape,
                     [&](const Array& like, Array& out) {
                       dt = like.dtype();
                       return c->sendrecv_into(send, dest, out, s, sendtag, g, &st, t);
                     },
                     [&](const Array& like) {
                       dt = like.dtype();
                       return c->sendrecv(send, like, s, dest, sendtag, g, &st, t);
                     });
  fill_status(a.get(7), st, dt);
  return r;
}

}  // namespace

void register_mpi(nb::module_& m) {
  def_fast<mpi_allreduce>(
      m, "mpi_allreduce", "allreduce", "(x, op, *, comm=None, token=None)",
      "Returns (result, token). Reduces x over all ranks with op (mpi4py.MPI.SUM, ..., a name, or a shardkit ReduceOp); "
      "every rank gets the result. comm defaults to a clone of COMM_WORLD.");
  def_fast<mpi_allgather>(
      m, "mpi_allgather", "allgather", "(x, *, comm=None, token=None)",
      "Returns (result, token). Every rank's x, stacked: shape (nproc, *x.shape). x must have the same shape and dtype "
      "on all ranks.");
  def_fast<mpi_alltoall>(
      m, "mpi_alltoall", "alltoall", "(x, *, comm=None, token=None)",
      "Returns (result, token). Block i of x (first axis, of size nproc) goes to rank i; block j of the result came from "
      "rank j.");
  def_fast<mpi_barrier>(m, "mpi_barrier", "barrier", "(*, comm=None, token=None)", "Returns a token. Waits for every rank.");
  def_fast<rooted<&Communicator::bcast>>(
      m, "mpi_bcast", "bcast", "(x, root, *, comm=None, token=None)",
      "Returns (result, token). Root's x on every rank, as a new array (x gives shape and dtype elsewhere and is never "
      "written).");
  def_fast<rooted<&Communicator::gather>>(
      m, "mpi_gather", "gather", "(x, root, *, comm=None, token=None)",
      "Returns (result, token). On root, every rank's x stacked: shape (nproc, *x.shape); elsewhere x, unchanged.");
  def_fast<mpi_reduce>(
      m, "mpi_reduce", "reduce", "(x, op, root, *, comm=None, token=None)",
      "Returns (result, token). On root, x reduced over all ranks with op; elsewhere x, unchanged.");
  def_fast<mpi_scan>(m, "mpi_scan", "scan", "(x, op, *, comm=None, token=None)",
                     "Returns (result, token). Inclusive prefix: rank r gets op over ranks 0..r.");
  def_fast<rooted<&Communicator::scatter>>(
      m, "mpi_scatter", "scatter", "(x, root, *, comm=None, token=None)",
      "Returns (result, token). Block r of root's x (shape (nproc, *s)) to rank r; elsewhere x gives the shape s (and is "
      "not read).");
  def_fast<mpi_send>(m, "mpi_send", "send", "(x, dest, *, tag=0, comm=None, token=None)",
                     "Returns a token. Sends x to rank dest.");
  def_fast<mpi_recv>(
      m, "mpi_recv", "recv", "(x, source=ANY_SOURCE, *, tag=ANY_TAG, comm=None, status=None, token=None)",
      "Returns (result, token). Receives a new array shaped like x (which is never written). status: an mpi4py Status "
      "to fill.");
  def_fast<mpi_sendrecv>(
      m, "mpi_sendrecv", "sendrecv",
      "(sendbuf, recvbuf, source, dest, *, sendtag=0, recvtag=ANY_TAG, comm=None, status=None, token=None)",
      "Returns (result, token). Sends sendbuf to dest while receiving a new array shaped like recvbuf from source.");
}

}  // namespace shardkit::py
