// Meshes, partition specs, sharded arrays and shard_map. The Python layer (shardkit/_sharding.py) adds JAX's
// spellings on top (P(...), Mesh(devices, names), decorators, framework tracking).

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <complex>
#include <functional>

#include "py_array.hpp"
#include "py_comm.hpp"
#include "py_fastcall.hpp"
#include "py_sharding.hpp"
#include "jax/jax_layer.hpp"
#include "shardkit/sharding/sharding.hpp"

namespace shardkit::py {

namespace nb = nanobind;

namespace {

std::size_t hash_mix(std::size_t h, std::size_t v) { return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)); }

// Over what Mesh's operator== compares: shape, names, device order, communicator.
std::size_t mesh_hash(const Mesh& m) {
  std::size_t h = std::hash<const void*>{}(m.comm().get());
  for (std::int64_t n : m.shape()) h = hash_mix(h, std::hash<std::int64_t>{}(n));
  for (const std::string& name : m.axis_names()) h = hash_mix(h, std::hash<std::string>{}(name));
  for (int d : m.devices()) h = hash_mix(h, std::hash<int>{}(d));
  return h;
}

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

}  // namespace

Axes axes_from(nb::handle h) {
  if (nb::isinstance<nb::str>(h)) return Axes(nb::cast<std::string>(h));
  std::vector<std::string> names;
  for (nb::handle n : h) names.push_back(nb::cast<std::string>(n));
  return Axes(std::move(names));
}

namespace {

nb::object entry_to_py(const PartitionSpec::Entry& e) {
  if (e.is_none()) return nb::none();
  if (e.axes().size() == 1) return nb::str(e.axes()[0].c_str());
  nb::list l;
  for (const auto& n : e.axes()) l.append(nb::str(n.c_str()));
  return nb::tuple(l);
}

}  // namespace

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

namespace {

// A device of a mesh's device array: a rank (anything with __index__, as NumPy's integers), or an object with an
// integer `id` (as JAX's devices: in shardkit a rank is the device).
int rank_of_device(nb::handle d) {
  if (PyIndex_Check(d.ptr())) return nb::cast<int>(nb::steal(PyNumber_Index(d.ptr())));
  if (nb::hasattr(d, "id")) return nb::cast<int>(d.attr("id"));
  throw InvalidArgument(shardkit::detail::concat("Mesh: a device is a rank (an int) or an object with an integer .id, as JAX's "
                                       "devices; got ", nb::type_name(d.type()).c_str()));
}

// Mesh(devices, names) as JAX spells it: an array of devices (NumPy, any shape) places rank devices.flat[p] at
// row-major position p; a sequence of devices (objects with .id) is a 1-d mesh. shardkit's own spellings stay: an int
// n is a 1-d mesh of n ranks in order, a sequence of ints the shape of a mesh with its ranks in row-major order.
void mesh_layout_from(nb::handle devices, std::vector<std::int64_t>& shape, std::vector<int>& ranks) {
  if (PyLong_Check(devices.ptr())) {
    shape.push_back(nb::cast<std::int64_t>(devices));
    return;
  }
  if (nb::hasattr(devices, "shape")) {
    for (nb::handle d : nb::cast<nb::tuple>(devices.attr("shape"))) shape.push_back(nb::cast<std::int64_t>(d));
    nb::object flat = nb::hasattr(devices, "flat") ? devices.attr("flat") : devices.attr("reshape")(-1);
    for (nb::handle d : flat) ranks.push_back(rank_of_device(d));
    return;
  }
  std::vector<nb::object> items;
  for (nb::handle d : devices) items.push_back(nb::borrow(d));
  const bool objects = !items.empty() && std::all_of(items.begin(), items.end(), [](const nb::object& d) {
    return !PyIndex_Check(d.ptr()) && nb::hasattr(d, "id");
  });
  if (objects) {
    shape.push_back(static_cast<std::int64_t>(items.size()));
    for (const nb::object& d : items) ranks.push_back(rank_of_device(d));
    return;
  }
  for (const nb::object& d : items) shape.push_back(nb::cast<std::int64_t>(d));
}

// A NumPy array of ranks in the mesh's shape (JAX's mesh.devices / mesh.device_ids).
nb::object devices_array(const Mesh& mesh) {
  nb::list ranks;
  for (int r : mesh.devices()) ranks.append(r);
  nb::list shape;
  for (std::int64_t n : mesh.shape()) shape.append(n);
  return nb::module_::import_("numpy").attr("array")(ranks).attr("reshape")(nb::tuple(shape));
}

// {rank: (slice, ...)} as JAX's devices_indices_map, in the order of the mesh's device array: a dimension cut into
// several shards gives slice(start, stop), one that is not gives slice(None).
nb::dict indices_map(const NamedSharding& s, const Shape& shape, const std::vector<int>& ranks) {
  nb::dict out;
  nb::object none = nb::none();
  for (int r : ranks) {
    const std::vector<IndexRange> idx = s.index(shape, r);
    nb::list slices;
    for (std::size_t d = 0; d < idx.size(); ++d) {
      if (d < s.spec().size() && s.num_shards(static_cast<int>(d)) > 1)
        slices.append(nb::slice(nb::int_(idx[d].start), nb::int_(idx[d].stop), none));
      else
        slices.append(nb::slice(none, none, none));
    }
    out[nb::int_(r)] = nb::tuple(slices);
  }
  return out;
}

// PartitionSpec (P(...)): entries of None, a name or a tuple of names.
void bind_partition_spec(nb::module_& m) {
  nb::class_<PartitionSpec>(m, "PartitionSpec", "How each dimension is cut over mesh axes (JAX's PartitionSpec).")
      .def("__init__", [](PartitionSpec* self, nb::args entries) {
        std::vector<PartitionSpec::Entry> e;
        for (nb::handle h : entries) e.push_back(entry_from(h));
        new (self) PartitionSpec(std::move(e));
      }, nb::sig("def __init__(self, *entries: str | collections.abc.Sequence[str] | None) -> None"),
         "One entry per dimension: None (not cut), a mesh axis name, or a tuple of names (cut over all of them).")
      .def_static("parse", [](const std::string& text) { return PartitionSpec::parse(text); }, nb::arg("text"),
                  "Parses Python-like text: \"P('x', None)\", \"('x', 'y'), None\", \"x, None\", \"\" (replicated).")
      .def("__len__", &PartitionSpec::size)
      .def("__getitem__", [](const PartitionSpec& s, std::size_t i) {
        if (i >= s.size()) throw nb::index_error();
        return entry_to_py(s[i]);
      }, nb::sig("def __getitem__(self, index: int, /) -> str | tuple[str, ...] | None"))
      .def("__iter__", [](const PartitionSpec& s) {
        nb::list l;
        for (const auto& e : s.entries()) l.append(entry_to_py(e));
        return nb::iter(l);
      }, nb::sig("def __iter__(self) -> collections.abc.Iterator[str | tuple[str, ...] | None]"))
      // Typed as object.__eq__ is: another type compares unequal (nanobind returns NotImplemented for it).
      .def("__eq__", [](const PartitionSpec& a, const PartitionSpec& b) { return a == b; }, nb::is_operator(),
           nb::sig("def __eq__(self, other: object, /) -> bool"))
      .def("__hash__", [](const PartitionSpec& s) { return nb::hash(nb::str(s.normalized().to_string().c_str())); })
      .def("__repr__", &PartitionSpec::to_string);
}

// Mesh: JAX's constructor from a device array and axis names, and the axis queries shard_map bodies use.
void bind_mesh(nb::module_& m) {
  nb::class_<Mesh>(m, "Mesh",
                   "Processes arranged on named axes (JAX's Mesh over MPI ranks). Mesh(np.array(devices), names) puts "
                   "rank devices.flat[p] at row-major position p, as JAX places devices (a device is a rank, or an "
                   "object with an integer .id); Mesh(n, name) and Mesh((n0, n1, ...), names) place the ranks in "
                   "row-major order.")
      // Mesh(shape, names) or, as JAX spells it, Mesh(np.array(devices), names): the array's shape is the mesh's.
      // axis_names may be one string for a 1-d mesh.
      .def("__init__", [](Mesh* self, nb::handle devices, nb::handle axis_names, nb::handle comm) {
        std::vector<std::int64_t> shape;
        std::vector<int> ranks;
        mesh_layout_from(devices, shape, ranks);
        std::vector<std::string> names;
        if (nb::isinstance<nb::str>(axis_names))
          names.push_back(nb::cast<std::string>(axis_names));
        else
          for (nb::handle n : axis_names) names.push_back(nb::cast<std::string>(n));
        std::shared_ptr<Communicator> c = comm_from(comm);
        nb::gil_scoped_release release;
        new (self) Mesh(std::move(shape), std::move(names), std::move(ranks), std::move(c));
      }, nb::arg("devices"), nb::arg("axis_names"), nb::arg("comm") = nb::none(),
         nb::sig("def __init__(self, devices: int | collections.abc.Sequence[object] | "
                 "numpy.typing.NDArray[typing.Any], axis_names: str | collections.abc.Sequence[str], "
                 "comm: Communicator | mpi4py.MPI.Comm | None = None) -> None"))
      .def_static("abstract", &Mesh::abstract, nb::arg("shape"), nb::arg("axis_names"),
                  nb::arg("devices") = std::vector<int>{})
      .def_prop_ro("devices", &devices_array,
                   nb::for_getter(nb::sig("def devices(self) -> numpy.typing.NDArray[numpy.int64]")),
                   "The rank at each position (JAX's mesh.devices; a rank is a device).")
      .def_prop_ro("device_ids", &devices_array,
                   nb::for_getter(nb::sig("def device_ids(self) -> numpy.typing.NDArray[numpy.int64]")),
                   "The rank at each position (JAX's mesh.device_ids).")
      .def_prop_ro("shape", &Mesh::shape)
      .def_prop_ro("axis_names", &Mesh::axis_names)
      .def_prop_ro("size", &Mesh::size)
      .def_prop_ro("rank", &Mesh::rank)
      .def_prop_ro("comm", &Mesh::comm)
      .def("coords", &Mesh::coords, nb::arg("rank"))
      .def("rank_at", &Mesh::rank_at, nb::arg("coords"))
      .def("axis_size", [](const Mesh& mesh, nb::handle axes) { return mesh.axis_size(axes_from(axes)); },
           nb::arg("axes"), nb::sig("def axis_size(self, axes: str | collections.abc.Sequence[str]) -> int"))
      .def("axis_index", [](const Mesh& mesh, nb::handle axes, std::optional<int> rank) {
        return mesh.axis_index(axes_from(axes), rank ? *rank : mesh.rank());
      }, nb::arg("axes"), nb::arg("rank") = nb::none(),
         nb::sig("def axis_index(self, axes: str | collections.abc.Sequence[str], rank: int | None = None) -> int"))
      .def("axis_comm", [](const Mesh& mesh, nb::handle axes) {
        Axes a = axes_from(axes);
        nb::gil_scoped_release release;
        return mesh.axis_comm(a);
      }, nb::arg("axes"), nb::sig("def axis_comm(self, axes: str | collections.abc.Sequence[str]) -> Communicator"))
      // Equal meshes hash alike (jax.jit keys its cache on the mesh of a shard_map body); another type is unequal.
      .def("__eq__", [](const Mesh& a, const Mesh& b) { return a == b; }, nb::is_operator(),
           nb::sig("def __eq__(self, other: object, /) -> bool"))
      .def("__hash__", &mesh_hash)
      .def("__repr__", &Mesh::to_string);
}

// NamedSharding: a mesh and a spec; where each rank's block lies.
void bind_named_sharding(nb::module_& m) {
  nb::class_<NamedSharding>(m, "NamedSharding", "A mesh and a partition spec (JAX's NamedSharding).")
      .def(nb::init<Mesh, PartitionSpec, bool>(), nb::arg("mesh"), nb::arg("spec"), nb::arg("uneven") = false)
      .def_prop_ro("mesh", &NamedSharding::mesh)
      .def_prop_ro("spec", &NamedSharding::spec)
      .def_prop_ro("uneven", &NamedSharding::uneven)
      .def("shard_shape", [](const NamedSharding& s, const Shape& shape) {
        nb::list out;
        for (std::int64_t n : s.shard_shape(shape)) out.append(n);
        return nb::tuple(out);
      }, nb::arg("global_shape"),
         nb::sig("def shard_shape(self, global_shape: collections.abc.Sequence[int]) -> tuple[int, ...]"),
         "The block shape (a tuple, as JAX's).")
      .def_prop_ro("is_fully_replicated", &NamedSharding::fully_replicated)
      .def_prop_ro("replicated_axes", &NamedSharding::replicated_axes,
                   "The mesh axes the spec does not name: the array is replicated over them (mesh order).")
      .def_prop_ro("num_devices", [](const NamedSharding& s) { return s.mesh().size(); })
      .def("devices_indices_map", [](const NamedSharding& s, const Shape& shape) {
        return indices_map(s, shape, s.mesh().devices());
      }, nb::arg("global_shape"),
         nb::sig("def devices_indices_map(self, global_shape: collections.abc.Sequence[int]) -> "
                 "dict[int, tuple[slice, ...]]"),
         "{rank: tuple of slices} for every rank of the mesh (JAX's devices_indices_map).")
      .def("addressable_devices_indices_map", [](const NamedSharding& s, const Shape& shape) {
        return indices_map(s, shape, {s.mesh().rank()});
      }, nb::arg("global_shape"),
         nb::sig("def addressable_devices_indices_map(self, global_shape: collections.abc.Sequence[int]) -> "
                 "dict[int, tuple[slice, ...]]"),
         "{this rank: tuple of slices}: a process addresses its own rank only.")
      .def("local_shape", &NamedSharding::local_shape, nb::arg("global_shape"), nb::arg("rank"),
           "The shape of the block `rank` holds.")
      .def("num_shards", &NamedSharding::num_shards, nb::arg("dim"), "The number of shards along dimension `dim`.")
      .def("index", [](const NamedSharding& s, const Shape& shape, int rank) {
        std::vector<std::pair<std::int64_t, std::int64_t>> out;
        for (const auto& r : s.index(shape, rank)) out.emplace_back(r.start, r.stop);
        return out;
      }, nb::arg("global_shape"), nb::arg("rank"), "The block `rank` holds: (start, stop) per dimension.")
      .def("validate", &NamedSharding::validate, nb::arg("global_shape"),
           "Checks a global shape against the spec (raises InvalidArgument).")
      .def("__eq__", [](const NamedSharding& a, const NamedSharding& b) { return a == b; }, nb::is_operator(),
           nb::sig("def __eq__(self, other: object, /) -> bool"))
      .def("__hash__", [](const NamedSharding& s) {
        return hash_mix(hash_mix(mesh_hash(s.mesh()), std::hash<std::string>{}(s.spec().normalized().to_string())),
                        s.uneven());
      })
      .def("__repr__", &NamedSharding::to_string);
}

// ShardedArray and the functions that make, gather, reshard and multiply them.
void bind_sharded_arrays(nb::module_& m) {
  nb::class_<ShardedArray>(m, "ShardedArray", "A global array cut across a mesh; this rank holds `local`.")
      .def_prop_ro("shape", &ShardedArray::shape)
      .def_prop_ro("sharding", &ShardedArray::sharding)
      .def_prop_ro("dtype", [](const ShardedArray& x) { return std::string(dtype_name(x.dtype())); })
      .def_prop_ro("device", [](const ShardedArray& x) { return x.device().to_string(); })
      .def("local", [](const ShardedArray& x, const std::string& framework) {
        // A view of the block the ShardedArray holds: read-only, as JAX's shards are immutable.
        return array_to_py(x.local(), framework_from(framework), /*read_only=*/true);
      }, nb::arg("framework") = "numpy", nb::sig("def local(self, framework: str = 'numpy') -> typing.Any"))
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
  m.def("_plan_reshard", [](const Shape& shape, const NamedSharding& from, const NamedSharding& to, int rank) {
    // What the traced shard_map needs of reshard's plan (shardkit.jax._shard_map compiles it): the kind, the
    // all_gather's axes and members, and this rank's blocks before and after.
    const ReshardPlan p = plan_reshard(shape, from, to, rank);
    auto box = [](const Box& b) {
      std::vector<std::pair<std::int64_t, std::int64_t>> out;
      for (const IndexRange& r : b) out.emplace_back(r.start, r.stop);
      return out;
    };
    nb::dict d;
    d["kind"] = to_string(p.kind);
    d["gather_axes"] = p.gather_axes;
    d["members"] = p.members;
    d["source"] = box(p.source);
    d["target"] = box(p.target);
    return d;
  }, nb::arg("global_shape"), nb::arg("source"), nb::arg("target"), nb::arg("rank"),
     "reshard's plan for `rank` (shardkit::plan_reshard): kind, gather_axes, members, source and target boxes.");
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
}

}  // namespace

void register_sharding(nb::module_& m) {
  bind_partition_spec(m);
  bind_mesh(m);
  bind_named_sharding(m);
  bind_sharded_arrays(m);
}

}  // namespace shardkit::py
