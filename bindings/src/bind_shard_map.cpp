// What a shard_map body calls: ShardContext and the axis collectives (psum, all_gather, ...) on Python values, the
// axis plans the traced body executes (shardkit.jax._collectives), and shard_map itself.

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <complex>

#include "jax/jax_layer.hpp"
#include "py_array.hpp"
#include "py_comm.hpp"
#include "py_fastcall.hpp"
#include "py_sharding.hpp"
#include "shardkit/sharding/sharding.hpp"

namespace shardkit::py {

namespace nb = nanobind;

namespace {

// The context of the shard_map body running on this thread (set around the Python body).
thread_local ShardContext* g_context = nullptr;

ShardContext& current_context() {
  if (!g_context)
    throw InvalidArgument("axis collectives (psum, all_gather, ...) can only be called inside a shard_map body");
  return *g_context;
}

// A Python bool, int, float or complex (not a NumPy scalar or a 0-d array: those carry a dtype).
bool is_python_scalar(nb::handle x) {
  return PyLong_CheckExact(x.ptr()) || PyBool_Check(x.ptr()) || PyFloat_CheckExact(x.ptr()) ||
         PyComplex_CheckExact(x.ptr());
}

// An axis reduction of a Python scalar (which may differ from rank to rank, so it is communicated). The result is a
// Python scalar again: as JAX's psum(1, axis) is weakly typed, `x_f32 * 0 + psum(1, "x")` stays float32. bool counts
// as int (JAX's psum sums bools as int32); pmean of an int gives a float (JAX's psum(x) / n).
nb::object scalar_op(ShardContext& c, nb::handle x, const Axes& axes, std::optional<ReduceOp> op /* pmean: none */) {
  auto comm = c.mesh().axis_comm(axes);
  auto reduce = [&](Array in) {
    Array out;
    {
      nb::gil_scoped_release release;
      Result r = comm->allreduce(in, op.value_or(ReduceOp::kSum), c.token());
      c.token() = r.token;
      c.token().wait();
      out = std::move(r.value);
    }
    return out;
  };
  const double n = static_cast<double>(c.mesh().axis_size(axes));
  if (PyComplex_CheckExact(x.ptr())) {
    const std::complex<double> v(PyComplex_RealAsDouble(x.ptr()), PyComplex_ImagAsDouble(x.ptr()));
    std::complex<double> r = reduce(Array::from_values<std::complex<double>>({v})).to_vector<std::complex<double>>()[0];
    if (!op) r /= n;
    return nb::steal(PyComplex_FromDoubles(r.real(), r.imag()));
  }
  if (PyFloat_CheckExact(x.ptr())) {
    const double r = reduce(Array::from_values<double>({nb::cast<double>(x)})).to_vector<double>()[0];
    return nb::float_(op ? r : r / n);
  }
  const auto r = reduce(Array::from_values<std::int64_t>({nb::cast<std::int64_t>(x)})).to_vector<std::int64_t>()[0];
  if (!op) return nb::float_(static_cast<double>(r) / n);
  return nb::int_(r);
}

void refuse_axis_index_groups(nb::handle groups, const char* op) {
  if (groups.is_none()) return;
  throw InvalidArgument(shardkit::detail::concat(
      op,
      ": axis_index_groups is not supported. Give the groups a mesh axis of their own and name only the axis "
      "within them: e.g. for groups [[0, 1], [2, 3]] of an axis 'x' of size 4, a mesh of shape (2, 2) with axes "
      "('g', 'x') (the same device array, reshaped) and ",
      op, "(x, 'x')"));
}

// ShardContext collectives on Python arrays: the result comes back in the input's framework.
template <typename F>
nb::object ctx_op(nb::handle x, F&& f) {
  note_call_site();
  Framework fw;
  Array a = array_from_py(x, &fw);
  std::optional<Array> out;
  {
    nb::gil_scoped_release release;
    out.emplace(f(a));
  }
  return array_to_py(std::move(*out), fw);
}

// psum/pmax/pmin (`what`, reducing with `op`): a Python scalar as scalar_op; anything else as the value form of
// allreduce over the axes' communicator, ordered on the body's token.
// A bool array (JAX's rules, axis_reduction: psum counts as int32, pmax/pmin are or/and) runs ShardContext's plan,
// which converts it; the one attribute read that tells is the per-call cost of the others.
nb::object reduce_op(ShardContext& c, nb::handle x, nb::handle axes, AxisOp what, ReduceOp op) {
  const Axes a = axes_from(axes);
  note_call_site();
  if (is_python_scalar(x)) return scalar_op(c, x, a, op);
  static const nb::object bool_dtype = nb::module_::import_("numpy").attr("dtype")("bool");
  if (nb::object dt = nb::getattr(x, "dtype", nb::none()); !dt.is_none() && dt.equal(bool_dtype))
    return ctx_op(x, [&](const Array& v) { return c.run(what, v, a); });
  auto comm = c.mesh().axis_comm(a);
  OpArgs args;
  args.reduce = op;
  try {
    return value_py(*comm, OpKind::kAllreduce, x, args, c.token());
  } catch (const InvalidArgument&) {
    // A refusal speaks in the axis collective's terms, as the traced body's, where the plan refuses the dtype.
    plan_axis(what, c.mesh(), a, {}, array_from_py(x).dtype());
    throw;
  }
}

// The axis reductions as module functions (the per-call hot path of shard_map bodies): they act on the context of the
// running shard_map body.
// JAX tracers, and bodies traced under jax.jit (no running context), take shardkit._sharding's traced context.
template <AxisOp what, ReduceOp op>
nb::object axis_reduce(const FastArgs& a) {
  const char* name = axis_op_name(what);
  refuse_axis_index_groups(a.get(Field::kAxisIndexGroups), name);
  nb::handle x = a.get(Field::kX);
  if (!g_context || jax_tracer(x))
    return nb::module_::import_("shardkit._sharding").attr("_context")(x).attr(name)(x, a.get(Field::kAxisName));
  return reduce_op(*g_context, x, a.get(Field::kAxisName), what, op);
}

// Shape moves as Python tuples: ("move", from, to) or ("reshape", shape).
nb::list moves_to_py(const std::vector<ShapeMove>& moves) {
  nb::list out;
  for (const ShapeMove& m : moves) {
    if (m.from >= 0)
      out.append(nb::make_tuple("move", m.from, m.to));
    else
      out.append(nb::make_tuple("reshape", nb::tuple(nb::cast(m.shape))));
  }
  return out;
}

}  // namespace

void register_shard_map(nb::module_& m) {
  nb::class_<ShardContext>(m, "ShardContext", "What a shard_map body can call (valid during the call only).")
      .def_prop_ro("mesh", &ShardContext::mesh)
      .def("axis_index", [](const ShardContext& c, nb::handle axes) { return c.axis_index(axes_from(axes)); })
      .def("axis_size", [](const ShardContext& c, nb::handle axes) { return c.axis_size(axes_from(axes)); })
      .def("psum", [](ShardContext& c, nb::handle x,
                      nb::handle axes) { return reduce_op(c, x, axes, AxisOp::kPsum, ReduceOp::kSum); })
      .def("pmean",
           [](ShardContext& c, nb::handle x, nb::handle axes) {
             Axes a = axes_from(axes);
             if (is_python_scalar(x)) return scalar_op(c, x, a, std::nullopt);
             return ctx_op(x, [&](const Array& v) { return c.pmean(v, a); });
           })
      .def("pmax", [](ShardContext& c, nb::handle x,
                      nb::handle axes) { return reduce_op(c, x, axes, AxisOp::kPmax, ReduceOp::kMax); })
      .def("pmin", [](ShardContext& c, nb::handle x,
                      nb::handle axes) { return reduce_op(c, x, axes, AxisOp::kPmin, ReduceOp::kMin); })
      .def(
          "all_gather",
          [](ShardContext& c, nb::handle x, nb::handle axes, int axis, bool tiled) {
            Axes a = axes_from(axes);
            return ctx_op(x, [&](const Array& v) { return c.all_gather(v, a, axis, tiled); });
          },
          nb::arg("x"), nb::arg("axis_name"), nb::arg("axis") = 0, nb::arg("tiled") = false)
      .def(
          "psum_scatter",
          [](ShardContext& c, nb::handle x, nb::handle axes, int dim, bool tiled) {
            Axes a = axes_from(axes);
            return ctx_op(x, [&](const Array& v) { return c.psum_scatter(v, a, dim, tiled); });
          },
          nb::arg("x"), nb::arg("axis_name"), nb::arg("scatter_dimension") = 0, nb::arg("tiled") = false)
      .def(
          "ppermute",
          [](ShardContext& c, nb::handle x, nb::handle axes, std::vector<std::pair<int, int>> perm) {
            Axes a = axes_from(axes);
            return ctx_op(x, [&](const Array& v) { return c.ppermute(v, a, perm); });
          },
          nb::arg("x"), nb::arg("axis_name"), nb::arg("perm"))
      .def(
          "all_to_all",
          [](ShardContext& c, nb::handle x, nb::handle axes, int split, int concat, bool tiled) {
            Axes a = axes_from(axes);
            return ctx_op(x, [&](const Array& v) { return c.all_to_all(v, a, split, concat, tiled); });
          },
          nb::arg("x"), nb::arg("axis_name"), nb::arg("split_axis"), nb::arg("concat_axis"), nb::arg("tiled") = false)
      .def(
          "pbroadcast",
          [](ShardContext& c, nb::handle x, nb::handle axes, int source) {
            Axes a = axes_from(axes);
            return ctx_op(x, [&](const Array& v) { return c.pbroadcast(v, a, source); });
          },
          nb::arg("x"), nb::arg("axis_name"), nb::arg("source"));

  const std::vector<Param> axis_params = {arg(Field::kX), arg(Field::kAxisName), kw(Field::kAxisIndexGroups, "None")};
  def_fast<axis_reduce<AxisOp::kPsum, ReduceOp::kSum>>(
      m, "psum", "psum", axis_params,
      "Sum over the ranks along the named mesh axis (or tuple of axes). A Python scalar gives a Python "
      "scalar (weakly typed, as JAX's psum(1, axis)). axis_index_groups is refused (use a mesh axis).");
  def_fast<axis_reduce<AxisOp::kPmax, ReduceOp::kMax>>(m, "pmax", "pmax", axis_params,
                                                       "Maximum over the ranks along the named axes.");
  def_fast<axis_reduce<AxisOp::kPmin, ReduceOp::kMin>>(m, "pmin", "pmin", axis_params,
                                                       "Minimum over the ranks along the named axes.");
  m.def("refuse_axis_index_groups", &refuse_axis_index_groups, nb::arg("groups").none(), nb::arg("op"));
  // The plans of the axis collectives, for the traced shard_map body (shardkit.jax._collectives), which executes them
  // on JAX tracers as ShardContext executes them on arrays.
  nb::class_<AxisPlan>(m, "_AxisPlan", "What this rank runs for one axis collective (shardkit::plan_axis).")
      .def_prop_ro("name", [](const AxisPlan& p) { return axis_op_name(p.what); })
      .def_prop_ro("op",
                   [](const AxisPlan& p) -> std::optional<std::string> {
                     if (!p.op) return std::nullopt;
                     return op_name(*p.op);
                   })
      .def_prop_ro("reduce", [](const AxisPlan& p) { return static_cast<int>(p.reduce); })
      .def_ro("root", &AxisPlan::root)
      .def_ro("dest", &AxisPlan::dest)
      .def_ro("source", &AxisPlan::source)
      .def_ro("tag", &AxisPlan::tag)
      .def_prop_ro("peers", [](const AxisPlan& p) { return static_cast<int>(p.peers); })
      .def_prop_ro("input", [](const AxisPlan& p) { return std::string(dtype_name(p.input)); })
      .def_prop_ro("output", [](const AxisPlan& p) { return std::string(dtype_name(p.output)); })
      .def_prop_ro("before", [](const AxisPlan& p) { return moves_to_py(p.before); })
      .def_prop_ro("after", [](const AxisPlan& p) { return moves_to_py(p.after); })
      .def_ro("divide", &AxisPlan::divide)
      .def_ro("zeros", &AxisPlan::zeros)
      .def_prop_ro("shape", [](const AxisPlan& p) { return nb::tuple(nb::cast(p.shape)); });
  m.def(
      "_axis_ops",
      [] {
        std::vector<std::string> names;
        for (int i = 0; i < kAxisOpCount; ++i) names.emplace_back(axis_op_name(static_cast<AxisOp>(i)));
        return names;
      },
      "The names of the axis collectives (shardkit::AxisOp), in table order.");
  m.def(
      "_plan_axis",
      [](const std::string& what, const Mesh& mesh, nb::handle axes, const Shape& shape, const std::string& dtype,
         int dim, int concat_dim, bool tiled, int source, std::vector<std::pair<int, int>> perm) {
        return plan_axis(
            axis_op_from_name(what), mesh, axes_from(axes), shape, dtype_from_name(dtype),
            {.dim = dim, .concat_dim = concat_dim, .tiled = tiled, .source = source, .perm = std::move(perm)});
      },
      nb::arg("what"), nb::arg("mesh"), nb::arg("axes"), nb::arg("shape"), nb::arg("dtype"), nb::arg("dim") = 0,
      nb::arg("concat_dim") = 0, nb::arg("tiled") = false, nb::arg("source") = 0,
      nb::arg("perm") = std::vector<std::pair<int, int>>{},
      "This rank's plan of axis collective `what` on a block of `shape` and `dtype` (shardkit::plan_axis).");
  m.def(
      "_exchange_op",
      [](int dest, int source) -> std::optional<std::string> {
        const std::optional<OpKind> op = exchange_op(dest, source);
        if (!op) return std::nullopt;
        return op_name(*op);
      },
      nb::arg("dest"), nb::arg("source"), "The operation of a ppermute member (shardkit::exchange_op), or None.");
  m.def(
      "current_context", [] { return &current_context(); }, nb::rv_policy::reference);

  m.def(
      "shard_map",
      [](nb::callable f, const Mesh& mesh, std::vector<PartitionSpec> in_specs, std::vector<PartitionSpec> out_specs,
         std::vector<ShardedArray> args, bool check_rep, const std::string& framework) {
        const Framework fw = framework_from(framework);
        // The body runs with the GIL; everything around it (resharding, checks, assembly) without.
        ShardFn body = [&](ShardContext& ctx, std::span<const Array> blocks) {
          nb::gil_scoped_acquire acquire;
          // The module-level collectives (shardkit.psum, ...) find this context while the body runs on this thread.
          ShardContext* previous = g_context;
          g_context = &ctx;
          struct Restore {
            ShardContext* p;
            ~Restore() { g_context = p; }
          } restore{previous};
          nb::list in;
          for (const Array& b : blocks) in.append(array_to_py(b, fw, /*read_only=*/true));
          nb::object result = f(nb::cast(&ctx, nb::rv_policy::reference), in);
          if (out_specs.empty() && nb::len(result) == 2) {
            // A body given no out_specs returns (blocks, their specs): the Python layer matches a pytree of out_specs
            // to the outputs' structure, known only now. shard_map reads out_specs once the body has returned.
            out_specs = nb::cast<std::vector<PartitionSpec>>(result[1]);
            result = result[0];
          }
          std::vector<Array> outs;
          for (nb::handle h : result) outs.push_back(array_from_py(h));
          return outs;
        };
        nb::gil_scoped_release release;
        return shard_map(body, mesh, in_specs, out_specs, args, ShardMapOptions{.check_rep = check_rep});
      },
      nb::arg("f"), nb::arg("mesh"), nb::arg("in_specs"), nb::arg("out_specs"), nb::arg("args"),
      nb::arg("check_rep") = true, nb::arg("framework") = "numpy");
}

}  // namespace shardkit::py
