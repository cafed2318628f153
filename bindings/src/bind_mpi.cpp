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

Token tok(nb::handle t) { return t.is_none() ? Token() : nb::cast<Token>(t); }

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

// The value form on any framework's array; the result goes back to that framework through DLPack.
template <typename Value>
nb::tuple value_call(nb::handle x, Value&& value) {
  Framework fw;
  Array a = array_from_py(x, &fw);
  std::optional<Result> r;
  {
    nb::gil_scoped_release release;
    r.emplace(value(a));
  }
  return nb::make_tuple(array_to_py(std::move(r->value), fw), token_object(r->token));
}

// A host NumPy input gets a NumPy result of the shape `result_shape` gives, filled in place by `fill` (a buffer form);
// anything else goes to `value`.
template <typename ShapeFn, typename Fill, typename Value>
nb::tuple call(const Communicator& c, nb::handle x, ShapeFn&& result_shape, Fill&& fill, Value&& value) {
  const bool owned = !completes_in_call(c);
  std::optional<Array> a = numpy_input(x, owned);
  if (!a) return value_call(x, std::forward<Value>(value));
  nb::object result;
  Array out = numpy_empty(result_shape(*a), a->dtype(), &result, owned);
  Token t;
  {
    nb::gil_scoped_release release;
    t = fill(*a, out);
    t.wait();  // NumPy reads the memory right away
  }
  return nb::make_tuple(result, token_object(t));
}

Shape stacked(int n, const Shape& s) {
  Shape out{n};
  out.insert(out.end(), s.begin(), s.end());
  return out;
}

Shape same_shape(const Array& a) { return a.shape(); }

}  // namespace

void register_mpi(nb::module_& m) {
  auto any_source = nb::int_(kAnySource);
  auto any_tag = nb::int_(kAnyTag);

  m.def("mpi_allreduce", [](nb::handle x, nb::handle op, nb::handle comm, nb::handle token) {
    CommPtr c = comm_from(comm);
    const ReduceOp o = reduce_op_of(op);
    const Token t = tok(token);
    return call(*c, x, same_shape, [&](const Array& a, Array& out) { return c->allreduce(a, out, o, t); },
                [&](const Array& a) { return c->allreduce(a, o, t); });
  }, nb::arg("x"), nb::arg("op"), nb::kw_only(), nb::arg("comm") = nb::none(), nb::arg("token") = nb::none(),
     "allreduce(x, op, *, comm=None, token=None) -> (result, token)\n\n"
     "Reduces x over all ranks with op (mpi4py.MPI.SUM, ..., a name, or a shardkit ReduceOp); every rank gets the "
     "result. comm defaults to a clone of COMM_WORLD.");

  m.def("mpi_allgather", [](nb::handle x, nb::handle comm, nb::handle token) {
    CommPtr c = comm_from(comm);
    const Token t = tok(token);
    return call(*c, x, [&](const Array& a) { return stacked(c->size(), a.shape()); },
                [&](const Array& a, Array& out) { return c->allgather(a, out, t); },
                [&](const Array& a) { return c->allgather(a, t); });
  }, nb::arg("x"), nb::kw_only(), nb::arg("comm") = nb::none(), nb::arg("token") = nb::none(),
     "allgather(x, *, comm=None, token=None) -> (result, token)\n\n"
     "Every rank's x, stacked: shape (nproc, *x.shape). x must have the same shape and dtype on all ranks.");

  m.def("mpi_alltoall", [](nb::handle x, nb::handle comm, nb::handle token) {
    CommPtr c = comm_from(comm);
    const Token t = tok(token);
    return value_call(x, [&](const Array& a) { return c->alltoall(a, t); });
  }, nb::arg("x"), nb::kw_only(), nb::arg("comm") = nb::none(), nb::arg("token") = nb::none(),
     "alltoall(x, *, comm=None, token=None) -> (result, token)\n\n"
     "Block i of x (first axis, of size nproc) goes to rank i; block j of the result came from rank j.");

  m.def("mpi_barrier", [](nb::handle comm, nb::handle token) {
    CommPtr c = comm_from(comm);
    const Token t = tok(token);
    Token r;
    {
      nb::gil_scoped_release release;
      r = c->barrier(t);
    }
    return token_object(r);
  }, nb::kw_only(), nb::arg("comm") = nb::none(), nb::arg("token") = nb::none(),
     "barrier(*, comm=None, token=None) -> token\n\nWaits for every rank.");

  m.def("mpi_bcast", [](nb::handle x, int root, nb::handle comm, nb::handle token) {
    CommPtr c = comm_from(comm);
    const Token t = tok(token);
    return value_call(x, [&](const Array& a) { return c->bcast(a, root, t); });
  }, nb::arg("x"), nb::arg("root"), nb::kw_only(), nb::arg("comm") = nb::none(), nb::arg("token") = nb::none(),
     "bcast(x, root, *, comm=None, token=None) -> (result, token)\n\n"
     "Root's x on every rank, as a new array (x gives shape and dtype elsewhere and is never written).");

  m.def("mpi_gather", [](nb::handle x, int root, nb::handle comm, nb::handle token) {
    CommPtr c = comm_from(comm);
    const Token t = tok(token);
    return value_call(x, [&](const Array& a) { return c->gather(a, root, t); });
  }, nb::arg("x"), nb::arg("root"), nb::kw_only(), nb::arg("comm") = nb::none(), nb::arg("token") = nb::none(),
     "gather(x, root, *, comm=None, token=None) -> (result, token)\n\n"
     "On root, every rank's x stacked: shape (nproc, *x.shape); elsewhere x, unchanged.");

  m.def("mpi_reduce", [](nb::handle x, nb::handle op, int root, nb::handle comm, nb::handle token) {
    CommPtr c = comm_from(comm);
    const ReduceOp o = reduce_op_of(op);
    const Token t = tok(token);
    return value_call(x, [&](const Array& a) { return c->reduce(a, o, root, t); });
  }, nb::arg("x"), nb::arg("op"), nb::arg("root"), nb::kw_only(), nb::arg("comm") = nb::none(),
     nb::arg("token") = nb::none(),
     "reduce(x, op, root, *, comm=None, token=None) -> (result, token)\n\n"
     "On root, x reduced over all ranks with op; elsewhere x, unchanged.");

  m.def("mpi_scan", [](nb::handle x, nb::handle op, nb::handle comm, nb::handle token) {
    CommPtr c = comm_from(comm);
    const ReduceOp o = reduce_op_of(op);
    const Token t = tok(token);
    return call(*c, x, same_shape, [&](const Array& a, Array& out) { return c->scan(a, out, o, t); },
                [&](const Array& a) { return c->scan(a, o, t); });
  }, nb::arg("x"), nb::arg("op"), nb::kw_only(), nb::arg("comm") = nb::none(), nb::arg("token") = nb::none(),
     "scan(x, op, *, comm=None, token=None) -> (result, token)\n\nInclusive prefix: rank r gets op over ranks 0..r.");

  m.def("mpi_scatter", [](nb::handle x, int root, nb::handle comm, nb::handle token) {
    CommPtr c = comm_from(comm);
    const Token t = tok(token);
    return value_call(x, [&](const Array& a) { return c->scatter(a, root, t); });
  }, nb::arg("x"), nb::arg("root"), nb::kw_only(), nb::arg("comm") = nb::none(), nb::arg("token") = nb::none(),
     "scatter(x, root, *, comm=None, token=None) -> (result, token)\n\n"
     "Block r of root's x (shape (nproc, *s)) to rank r; elsewhere x gives the shape s (and is not read).");

  m.def("mpi_send", [](nb::handle x, int dest, int tag, nb::handle comm, nb::handle token) {
    CommPtr c = comm_from(comm);
    const Token t = tok(token);
    Array a = array_from_py(x);
    Token r;
    {
      nb::gil_scoped_release release;
      r = c->send(a, dest, tag, t);
    }
    return token_object(r);
  }, nb::arg("x"), nb::arg("dest"), nb::kw_only(), nb::arg("tag") = 0, nb::arg("comm") = nb::none(),
     nb::arg("token") = nb::none(), "send(x, dest, *, tag=0, comm=None, token=None) -> token");

  m.def("mpi_recv", [](nb::handle x, int source, int tag, nb::handle comm, nb::handle status, nb::handle token) {
    CommPtr c = comm_from(comm);
    const Token t = tok(token);
    const int s = source_of(source), g = tag_of(tag);
    RecvStatus st;
    DType dt = DType::kFloat32;
    nb::tuple r = call(*c, x, same_shape,
                       [&](const Array& like, Array& out) {
                         dt = like.dtype();
                         return c->recv_into(out, s, g, &st, t);
                       },
                       [&](const Array& like) {
                         dt = like.dtype();
                         return c->recv(like, s, g, &st, t);
                       });
    fill_status(status, st, dt);
    return r;
  }, nb::arg("x"), nb::arg("source") = any_source, nb::kw_only(), nb::arg("tag") = any_tag,
     nb::arg("comm") = nb::none(), nb::arg("status") = nb::none(), nb::arg("token") = nb::none(),
     "recv(x, source=ANY_SOURCE, *, tag=ANY_TAG, comm=None, status=None, token=None) -> (result, token)\n\n"
     "Receives a new array shaped like x (which is never written). status: an mpi4py Status to fill.");

  m.def("mpi_sendrecv", [](nb::handle sendbuf, nb::handle recvbuf, int source, int dest, int sendtag, int recvtag,
                           nb::handle comm, nb::handle status, nb::handle token) {
    CommPtr c = comm_from(comm);
    const Token t = tok(token);
    const int s = source_of(source), g = tag_of(recvtag);
    Array send = array_from_py(sendbuf);
    RecvStatus st;
    DType dt = DType::kFloat32;
    nb::tuple r = call(*c, recvbuf, same_shape,
                       [&](const Array& like, Array& out) {
                         dt = like.dtype();
                         return c->sendrecv_into(send, dest, out, s, sendtag, g, &st, t);
                       },
                       [&](const Array& like) {
                         dt = like.dtype();
                         return c->sendrecv(send, like, s, dest, sendtag, g, &st, t);
                       });
    fill_status(status, st, dt);
    return r;
  }, nb::arg("sendbuf"), nb::arg("recvbuf"), nb::arg("source"), nb::arg("dest"), nb::kw_only(),
     nb::arg("sendtag") = 0, nb::arg("recvtag") = any_tag, nb::arg("comm") = nb::none(), nb::arg("status") = nb::none(),
     nb::arg("token") = nb::none(),
     "sendrecv(sendbuf, recvbuf, source, dest, *, sendtag=0, recvtag=ANY_TAG, comm=None, status=None, token=None)"
     " -> (result, token)\n\nSends sendbuf to dest while receiving a new array shaped like recvbuf from source.");
}

}  // namespace shardkit::py
