// Checkpoints from Python: the C++ save/load/inspect of shardkit::checkpoint, one binding each. The pytree side
// (key paths, the tree's structure, specs per leaf, frameworks) is shardkit/checkpoint.py's.

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "py_comm.hpp"
#include "py_sharding.hpp"
#include "shardkit/checkpoint/checkpoint.hpp"

namespace shardkit::py {

namespace ck = shardkit::checkpoint;

namespace {

nb::dict array_info_to_py(const ck::ArrayInfo& a) {
  nb::dict d;
  d["key"] = a.key;
  d["shape"] = nb::tuple(nb::cast(a.shape));
  d["dtype"] = std::string(dtype_name(a.dtype));
  d["plain"] = a.plain;
  if (!a.plain) {
    d["mesh_shape"] = nb::tuple(nb::cast(a.mesh_shape));
    d["mesh_axes"] = nb::tuple(nb::cast(a.mesh_axes));
    d["mesh_devices"] = nb::cast(a.mesh_devices);
    d["spec"] = nb::cast(a.spec);
    d["uneven"] = a.uneven;
  }
  d["chunk_shape"] = nb::tuple(nb::cast(a.chunk_shape));
  d["inner_chunk_shape"] = nb::tuple(nb::cast(a.inner_chunk_shape));
  d["bytes"] = a.bytes;
  return d;
}

}  // namespace

void register_checkpoint(nb::module_& m) {
  nb::class_<ck::SaveHandle>(m, "SaveHandle", "A checkpoint save, in flight or committed.")
      .def_prop_ro("step", &ck::SaveHandle::step)
      .def_prop_ro("path", &ck::SaveHandle::path)
      .def_prop_ro("bytes_written", &ck::SaveHandle::bytes_written)
      .def("done", &ck::SaveHandle::done)
      .def("wait", &ck::SaveHandle::wait, nb::call_guard<nb::gil_scoped_release>(),
           "Finishes the save (collective while it is in flight) and raises its error, if any.");

  m.def(
      "checkpoint_save",
      [](const std::string& root, const std::vector<std::pair<std::string, nb::object>>& items,
         std::optional<std::int64_t> step, const std::string& metadata_json, const std::string& tree_json,
         int keep_last, std::int64_t chunk_bytes, bool sync, bool blocking, nb::handle comm,
         std::optional<std::string> rank_state_json, std::string caller_failure, std::optional<int> writer_nice) {
        std::vector<ck::Entry> entries;
        entries.reserve(items.size());
        for (const auto& [key, value] : items) {
          try {
            if (nb::isinstance<ShardedArray>(value))
              entries.push_back({key, nb::cast<ShardedArray>(value)});
            else
              entries.push_back({key, array_from_py(value)});
          } catch (const std::exception& e) {
            // Agreed on in the save (which the other entries keep on the others' communicator), so that no
            // other rank waits for this one.
            if (caller_failure.empty()) caller_failure = "save: the value at '" + key + "': " + e.what();
          }
        }
        ck::SaveOptions o;
        o.rank_state_json = std::move(rank_state_json);
        o.caller_failure = std::move(caller_failure);
        o.step = step;
        o.metadata_json = metadata_json;
        o.tree_json = tree_json;
        o.keep_last = keep_last;
        o.chunk_bytes = chunk_bytes;
        o.sync = sync;
        o.blocking = blocking;
        if (writer_nice) o.writer_nice = *writer_nice;
        if (!comm.is_none()) o.comm = comm_from(comm);
        nb::gil_scoped_release release;
        return ck::save(root, entries, o);
      },
      nb::arg("root"), nb::arg("entries"), nb::arg("step").none(), nb::arg("metadata_json"), nb::arg("tree_json"),
      nb::arg("keep_last"), nb::arg("chunk_bytes"), nb::arg("sync"), nb::arg("blocking"), nb::arg("comm").none(),
      nb::arg("rank_state_json").none() = nb::none(), nb::arg("caller_failure") = "",
      nb::arg("writer_nice").none() = nb::none());
  m.def("checkpoint_wait_for_saves", &ck::wait_for_saves, nb::call_guard<nb::gil_scoped_release>());
  m.def(
      "checkpoint_load",
      [](const std::string& root, const Mesh& mesh,
         const std::vector<std::tuple<std::string, PartitionSpec, std::optional<Shape>, std::optional<std::string>>>&
             items,
         std::optional<std::int64_t> step, std::optional<bool> uneven, std::optional<std::string> device) {
        std::vector<ck::Target> targets;
        targets.reserve(items.size());
        for (const auto& [key, spec, shape, dtype] : items) {
          std::optional<DType> dt;
          if (dtype) dt = dtype_from_name(*dtype);
          targets.push_back({key, spec, shape, dt});
        }
        ck::LoadOptions o;
        o.step = step;
        o.uneven = uneven;
        if (auto d = device_from(device)) o.device = *d;
        nb::gil_scoped_release release;
        return ck::load(root, mesh, targets, o);
      },
      nb::arg("root"), nb::arg("mesh"), nb::arg("targets"), nb::arg("step").none(), nb::arg("uneven").none(),
      nb::arg("device").none());
  m.def("checkpoint_steps", &ck::steps, nb::arg("root"));
  m.def(
      "checkpoint_inspect",
      [](const std::string& root, std::int64_t step, bool verify) {
        ck::StepInfo info;
        {
          nb::gil_scoped_release release;
          info = ck::inspect(root, step, verify);
        }
        nb::dict d;
        d["step"] = info.step;
        d["path"] = info.path;
        d["committed"] = info.committed;
        d["verified"] = info.verified;
        d["saved_ranks"] = info.saved_ranks;
        d["metadata_json"] = info.metadata_json;
        d["tree_json"] = info.tree_json;
        nb::list arrays;
        for (const auto& a : info.arrays) arrays.append(array_info_to_py(a));
        d["arrays"] = arrays;
        return d;
      },
      nb::arg("root"), nb::arg("step"), nb::arg("verify") = false);
}

}  // namespace shardkit::py
