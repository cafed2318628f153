// Meshes, partition specs, sharded arrays and shard_map. The Python layer (shardkit/_sharding.py) adds JAX's
// spellings on top (P(...), Mesh(devices, names), decorators, framework tracking).

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "py_array.hpp"
#include "py_comm.hpp"
#include "py_fastcall.hpp"
#include "jax/jax_layer.hpp"
#include "shardkit/sharding/sharding.hpp"

namespace shardkit::py {

namespace nb = nanobind;

namespace {

// A spec entry from Python: None, "x", or a tuple/list of names.
PartitionSpec::Entry entry_from(nb::handle h) {
  if (h.is_none()) return PartitionSpec::Entry(kNone);
  if (nb::isinstance<nb::str>(h)) return PartitionSpec::Entry(nb::cast<std::string>(h));
  if (nb::isinstance<nb::tuple>(h) || nb::isinstance<nb::list>(h)) {
    std::vector<std::string> names;
    for (nb::handle n : h) {
      if (!nb::isinstance<nb::str>(n))
        throw InvalidArgument("a partition spec tuple holds mesh axis names (str), got " +
                              std::string(nb::type_name(n.type()).c_str()));
      names.push_back(nb::cast<std::string>(n));
    }
    if (names.empty()) return PartitionSpec::Entry(kNone);
    return PartitionSpec::Entry(Axes(std::move(names)));
  }
  throw InvalidArgument("a partition spec entry is None, an axis name, or a tuple of axis names; got " +
                        std::string(nb::type_name(h.type()).c_str()));
}

Axes axes_from(nb::handle h) {
  if (nb::isinstance<nb::str>(h)) return Axes(nb::cast<std::string>(h));
  std::vector<std::string> names;
  for (nb::handle n : h) names.push_back(nb::cast<std::string>(n));
  return Axes(std::move(names));
}

nb::object entry_to_py(const PartitionSpec::Entry& e) {
  if (e.is_none()) return nb::none();
  if (e.axes().size() == 1) return nb::str(e.axes()[0].c_str());
  nb::list l;
  for (const auto& n : e.axes()) l.append(nb::str(n.c_str()));
  return nb::tuple(l);
}

Framework framework_from(const std::string& name) {
  for (Framework f : {Framework::kNumpy, Framework::kJax, Framework::kTorch, Framework::kCupy, Framework::kWarp,
                      Framework::kShardkit})
    if (name == framework_name(f)) return f;
  return Framework::kNumpy;
}

std::optional<Device> device_from(const std::optional<std::string>& d) {
  if (!d) return std::nullopt;
  if (*d == "cpu") return Device::cpu();
  if (d->rfind("cuda:", 0) == 0) return Device::cuda(std::stoi(d->substr(5)));
  if (*d == "cuda") return Device::cuda(0);
  throw InvalidArgument("unknown device '" + *d + "' (cpu, cuda or cuda:N)");
}

// The context of the shard_map body running on this thread (set around the Python body).
thread_local ShardContext* g_context = nullptr;

ShardContext& current_context() {
  if (!g_context)
    throw InvalidArgument("axis collectives (psum, all_gather, ...) can only be called inside a shard_map body");
  return *g_context;
}

// psum/pmax/pmin: the value form of allreduce over the axes' communicator, ordered on the body's token.
nb::object reduce_op(ShardContext& c, nb::handle x, nb::handle axes, ReduceOp op) {
  auto comm = c.mesh().axis_comm(axes_from(axes));
  OpArgs args;
  args.reduce = op;
  return value_py(*comm, OpKind::kAllreduce, x, args, c.token());
}

// The axis reductions as module functions (the per-call hot path of shard_map bodies): they act on the context of the
// running shard_map body.
// JAX tracers, and bodies traced under jax.jit (no running context), take shardkit._sharding's traced context.
nb::object axis_reduce(const FastArgs& a, ReduceOp op, const char* name) {
  nb::handle x = a.get(Field::kX);
  if (!g_context || jax_tracer(x))
    return nb::module_::import_("shardkit._sharding").attr("_context")(x).attr(name)(x, a.get(Field::kAxisName));
  return reduce_op(*g_context, x, a.get(Field::kAxisName), op);
}
nb::object psum(const FastArgs& a) { return axis_reduce(a, ReduceOp::kSum, "psum"); }
nb::object pmax(const FastArgs& a) { return axis_reduce(a, ReduceOp::kMax, "pmax"); }
nb::object pmin(const FastArgs& a) { return axis_reduce(a, ReduceOp::kMin, "pmin"); }

// ShardContext collectives on Python arrays: the result comes back in the input's framework.
template <typename F>
nb::object ctx_op(nb::handle x, F&& f) {
  Framework fw;
  Array a = array_from_py(x, &fw);
  std::optional<Array> out;
  {
    nb::gil_scoped_release release;
    out.emplace(f(a));
  }
  return array_to_py(std::move(*out), fw);
}

}  // namespace

void register_sharding(nb::module_& m) {
  nb::class_<PartitionSpec>(m, "PartitionSpec", "How each dimension is cut over mesh axes (JAX's PartitionSpec).")
      .def("__init__", [](PartitionSpec* self, nb::args entries) {
        std::vector<PartitionSpec::Entry> e;
        for (nb::handle h : entries) e.push_back(entry_from(h));
        new (self) PartitionSpec(std::move(e));
      })
      .def_static("parse", &PartitionSpec::parse)
      .def("__len__", &PartitionSpec::size)
      .def("__getitem__", [](const PartitionSpec& s, std::size_t i) {
        if (i >= s.size()) throw nb::index_error();
        return entry_to_py(s[i]);
      })
      .def("__iter__", [](const PartitionSpec& s) {
        nb::list l;
        for (const auto& e : s.entries()) l.append(entry_to_py(e));
        return nb::iter(l);
      })
      .def("__eq__", [](const PartitionSpec& a, const PartitionSpec& b) { return a == b; })
      .def("__hash__", [](const PartitionSpec& s) { return nb::hash(nb::str(s.normalized().to_string().c_str())); })
      .def("__repr__", &PartitionSpec::to_string);

  nb::class_<Mesh>(m, "Mesh", "Processes arranged on named axes (JAX's Mesh over MPI ranks).")
      // Mesh(shape, names) or, as JAX spells it, Mesh(np.array(devices), names): the array's shape is the mesh's.
      // axis_names may be one string for a 1-d mesh.
      .def("__init__", [](Mesh* self, nb::handle devices, nb::handle axis_names, nb::handle comm) {
        std::vector<std::int64_t> shape;
        if (nb::hasattr(devices, "shape")) {
          for (nb::handle d : nb::cast<nb::tuple>(devices.attr("shape"))) shape.push_back(nb::cast<std::int64_t>(d));
        } else if (PyLong_Check(devices.ptr())) {
          shape.push_back(nb::cast<std::int64_t>(devices));
        } else {
          for (nb::handle d : devices) shape.push_back(nb::cast<std::int64_t>(d));
        }
        std::vector<std::string> names;
        if (nb::isinstance<nb::str>(axis_names))
          names.push_back(nb::cast<std::string>(axis_names));
        else
          for (nb::handle n : axis_names) names.push_back(nb::cast<std::string>(n));
        std::shared_ptr<Communicator> c = comm_from(comm);
        nb::gil_scoped_release release;
        new (self) Mesh(std::move(shape), std::move(names), std::move(c));
      }, nb::arg("devices"), nb::arg("axis_names"), nb::arg("comm") = nb::none())
      .def_static("abstract", &Mesh::abstract, nb::arg("shape"), nb::arg("axis_names"))
      .def_prop_ro("shape", &Mesh::shape)
      .def_prop_ro("axis_names", &Mesh::axis_names)
      .def_prop_ro("size", &Mesh::size)
      .def_prop_ro("rank", &Mesh::rank)
      .def_prop_ro("comm", &Mesh::comm)
      .def("coords", &Mesh::coords)
      .def("axis_size", [](const Mesh& mesh, nb::handle axes) { return mesh.axis_size(axes_from(axes)); })
      .def("axis_index", [](const Mesh& mesh, nb::handle axes, std::optional<int> rank) {
        return mesh.axis_index(axes_from(axes), rank ? *rank : mesh.rank());
      }, nb::arg("axes"), nb::arg("rank") = nb::none())
      .def("axis_comm", [](const Mesh& mesh, nb::handle axes) {
        Axes a = axes_from(axes);
        nb::gil_scoped_release release;
        return mesh.axis_comm(a);
      })
      .def("__eq__", [](const Mesh& a, const Mesh& b) { return a == b; })
      .def("__repr__", &Mesh::to_string);

  nb::class_<NamedSharding>(m, "NamedSharding", "A mesh and a partition spec (JAX's NamedSharding).")
      .def(nb::init<Mesh, PartitionSpec, bool>(), nb::arg("mesh"), nb::arg("spec"), nb::arg("uneven") = false)
      .def_prop_ro("mesh", &NamedSharding::mesh)
      .def_prop_ro("spec", &NamedSharding::spec)
      .def_prop_ro("uneven", &NamedSharding::uneven)
      .def("shard_shape", &NamedSharding::shard_shape)
      .def("local_shape", &NamedSharding::local_shape)
      .def("num_shards", &NamedSharding::num_shards)
      .def("index", [](const NamedSharding& s, const Shape& shape, int rank) {
        std::vector<std::pair<std::int64_t, std::int64_t>> out;
        for (const auto& r : s.index(shape, rank)) out.emplace_back(r.start, r.stop);
        return out;
      })
      .def("validate", &NamedSharding::validate)
      .def("__eq__", [](const NamedSharding& a, const NamedSharding& b) { return a == b; })
      .def("__repr__", &NamedSharding::to_string);

  nb::class_<ShardedArray>(m, "ShardedArray", "A global array cut across a mesh; this rank holds `local`.")
      .def_prop_ro("shape", &ShardedArray::shape)
      .def_prop_ro("sharding", &ShardedArray::sharding)
      .def_prop_ro("dtype", [](const ShardedArray& x) { return std::string(dtype_name(x.dtype())); })
      .def_prop_ro("device", [](const ShardedArray& x) { return x.device().to_string(); })
      .def("local", [](const ShardedArray& x, const std::string& framework) {
        // A view of the block the ShardedArray holds: read-only, as JAX's shards are immutable.
        return array_to_py(x.local(), framework_from(framework), /*read_only=*/true);
      }, nb::arg("framework") = "numpy")
      .def("__repr__", &ShardedArray::describe);

  m.def("distribute", [](nb::handle global, const NamedSharding& s, int root, std::optional<std::string> device) {
    Array g = global.is_none() ? Array() : array_from_py(global);
    nb::gil_scoped_release release;
    return distribute(g, s, root, device_from(device));
  }, nb::arg("global_array").none(), nb::arg("sharding"), nb::arg("root") = 0, nb::arg("device") = nb::none());
  m.def("from_local", [](nb::handle local, Shape shape, const NamedSharding& s) {
    // Blocks are kept as given (shardkit never writes into them), but held writable-agnostic: import read-only.
    return from_local(array_from_py(local), std::move(shape), s);
  }, nb::arg("local"), nb::arg("global_shape"), nb::arg("sharding"));
  m.def("gather", [](const ShardedArray& x, int root, const std::string& framework) -> nb::object {
    Array g;
    {
      nb::gil_scoped_release release;
      g = gather(x, root);
    }
    if (x.mesh().rank() != root) return nb::none();
    return array_to_py(g, framework_from(framework));
  }, nb::arg("x"), nb::arg("root") = 0, nb::arg("framework") = "numpy");
  m.def("process_allgather", [](const ShardedArray& x, const std::string& framework) {
    Array g;
    {
      nb::gil_scoped_release release;
      g = process_allgather(x);
    }
    return array_to_py(g, framework_from(framework));
  }, nb::arg("x"), nb::arg("framework") = "numpy");
  m.def("reshard", &reshard, nb::arg("x"), nb::arg("sharding"), nb::call_guard<nb::gil_scoped_release>());
  m.def("matmul", [](const ShardedArray& a, const ShardedArray& b, const std::string& algorithm,
                     std::optional<bool> overlap) {
    const MatmulOptions o{parse_matmul_algorithm(algorithm), overlap};
    nb::gil_scoped_release release;
    return matmul(a, b, o);
  }, nb::arg("a"), nb::arg("b"), nb::arg("algorithm") = "auto", nb::arg("overlap").none() = nb::none());
  m.def("matmul_overlap_default", [](bool gpu) { return matmul_overlap_default(gpu ? Device::cuda() : Device::cpu()); },
        nb::arg("gpu") = false, "Whether matmul overlaps transfers with GEMMs by default, for host or GPU operands.");
  m.def("choose_matmul_algorithm", [](const ShardedArray& a, const ShardedArray& b) {
    return std::string(matmul_algorithm_name(choose_matmul_algorithm(a, b)));
  });
  m.def("visualize_sharding", [](const Shape& shape, const NamedSharding& s) { return visualize_sharding(shape, s); });

  nb::class_<ShardContext>(m, "ShardContext", "What a shard_map body can call (valid during the call only).")
      .def_prop_ro("mesh", &ShardContext::mesh)
      .def("axis_index", [](const ShardContext& c, nb::handle axes) { return c.axis_index(axes_from(axes)); })
      .def("axis_size", [](const ShardContext& c, nb::handle axes) { return c.axis_size(axes_from(axes)); })
      .def("psum", [](ShardContext& c, nb::handle x, nb::handle axes) { return reduce_op(c, x, axes, ReduceOp::kSum); })
      .def("pmean", [](ShardContext& c, nb::handle x, nb::handle axes) {
        Axes a = axes_from(axes);
        return ctx_op(x, [&](const Array& v) { return c.pmean(v, a); });
      })
      .def("pmax", [](ShardContext& c, nb::handle x, nb::handle axes) { return reduce_op(c, x, axes, ReduceOp::kMax); })
      .def("pmin", [](ShardContext& c, nb::handle x, nb::handle axes) { return reduce_op(c, x, axes, ReduceOp::kMin); })
      .def("all_gather", [](ShardContext& c, nb::handle x, nb::handle axes, int axis, bool tiled) {
        Axes a = axes_from(axes);
        return ctx_op(x, [&](const Array& v) { return c.all_gather(v, a, axis, tiled); });
      }, nb::arg("x"), nb::arg("axis_name"), nb::arg("axis") = 0, nb::arg("tiled") = false)
      .def("psum_scatter", [](ShardContext& c, nb::handle x, nb::handle axes, int dim, bool tiled) {
        Axes a = axes_from(axes);
        return ctx_op(x, [&](const Array& v) { return c.psum_scatter(v, a, dim, tiled); });
      }, nb::arg("x"), nb::arg("axis_name"), nb::arg("scatter_dimension") = 0, nb::arg("tiled") = false)
      .def("ppermute", [](ShardContext& c, nb::handle x, nb::handle axes, std::vector<std::pair<int, int>> perm) {
        Axes a = axes_from(axes);
        return ctx_op(x, [&](const Array& v) { return c.ppermute(v, a, perm); });
      }, nb::arg("x"), nb::arg("axis_name"), nb::arg("perm"))
      .def("all_to_all", [](ShardContext& c, nb::handle x, nb::handle axes, int split, int concat, bool tiled) {
        Axes a = axes_from(axes);
        return ctx_op(x, [&](const Array& v) { return c.all_to_all(v, a, split, concat, tiled); });
      }, nb::arg("x"), nb::arg("axis_name"), nb::arg("split_axis"), nb::arg("concat_axis"), nb::arg("tiled") = false)
      .def("pbroadcast", [](ShardContext& c, nb::handle x, nb::handle axes, int source) {
        Axes a = axes_from(axes);
        return ctx_op(x, [&](const Array& v) { return c.pbroadcast(v, a, source); });
      }, nb::arg("x"), nb::arg("axis_name"), nb::arg("source"));

  const std::vector<Param> axis_params = {arg(Field::kX), arg(Field::kAxisName)};
  def_fast<psum>(m, "psum", "psum", axis_params, "Sum over the ranks along the named mesh axis (or tuple of axes).");
  def_fast<pmax>(m, "pmax", "pmax", axis_params, "Maximum over the ranks along the named axes.");
  def_fast<pmin>(m, "pmin", "pmin", axis_params, "Minimum over the ranks along the named axes.");
  m.def("current_context", [] { return &current_context(); }, nb::rv_policy::reference);

  m.def("shard_map", [](nb::callable f, const Mesh& mesh, std::vector<PartitionSpec> in_specs,
                        std::vector<PartitionSpec> out_specs, std::vector<ShardedArray> args, bool check_rep,
                        const std::string& framework) {
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
      std::vector<Array> outs;
      for (nb::handle h : result) outs.push_back(array_from_py(h));
      return outs;
    };
    nb::gil_scoped_release release;
    return shard_map(body, mesh, in_specs, out_specs, args, ShardMapOptions{.check_rep = check_rep});
  }, nb::arg("f"), nb::arg("mesh"), nb::arg("in_specs"), nb::arg("out_specs"), nb::arg("args"),
     nb::arg("check_rep") = true, nb::arg("framework") = "numpy");
}

}  // namespace shardkit::py
