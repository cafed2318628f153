// The extension module shardkit._core. The Python package (bindings/python/shardkit) is the public face.

#include <nanobind/nanobind.h>

namespace shardkit::py {
namespace nb = nanobind;
void register_errors(nb::module_& m);
void register_arrays(nb::module_& m);
void register_runtime(nb::module_& m);
void register_collectives(nb::module_& m);
void register_sharding(nb::module_& m);
void register_shard_map(nb::module_& m);
void register_ops(nb::module_& m);
void register_jax(nb::module_& m);
void register_checkpoint(nb::module_& m);
}  // namespace shardkit::py

NB_MODULE(_core, m) {
  m.doc() = "shardkit's C++ core: arrays, runtime, communicators and sharding (use the shardkit package).";
  shardkit::py::register_errors(m);
  shardkit::py::register_arrays(m);
  shardkit::py::register_runtime(m);
  shardkit::py::register_collectives(m);
  shardkit::py::register_ops(m);
  shardkit::py::register_sharding(m);
  shardkit::py::register_shard_map(m);
  shardkit::py::register_jax(m);
  shardkit::py::register_checkpoint(m);
}
