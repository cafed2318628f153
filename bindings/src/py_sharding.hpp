#pragma once

// What the sharding bindings share: axis names and framework names from Python.

#include <nanobind/nanobind.h>

#include <optional>
#include <string>

#include "py_array.hpp"
#include "shardkit/sharding/partition_spec.hpp"

namespace shardkit::py {

/// "x" or a sequence of names.
Axes axes_from(nanobind::handle h);
/// A framework by its name ("numpy", "jax", ...); unknown names are NumPy.
Framework framework_from(const std::string& name);
/// A device by its name: "cpu", "cuda" or "cuda:N" (nothing for None). @throws InvalidArgument for other names.
std::optional<Device> device_from(const std::optional<std::string>& d);

}  // namespace shardkit::py
