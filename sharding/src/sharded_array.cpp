#include "shardkit/sharding/sharded_array.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>

#include "box.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/runtime.hpp"

namespace shardkit {
namespace {

using detail::block_of;
using detail::numel_of;
using detail::shape_of;

constexpr int kMaxDims = 32;

Device default_device() {
  const Runtime* rt = Runtime::current();
  return rt ? rt->device() : Device::cpu();
}

// Assembles a global host array from packed blocks laid end to end in `flat`, block j covering `ranges[j]`.
Array assemble(const Shape& global, DType dtype, const Array& flat, const std::vector<std::vector<IndexRange>>& ranges,
               const std::vector<std::int64_t>& counts) {
  Array out = Array::empty(global, dtype);
  Array host_flat = flat.to(Device::cpu());
  std::int64_t off = 0;
  for (std::size_t j = 0; j < ranges.size(); ++j) {
    if (counts[j] == 0) continue;
    Array dst = block_of(out, ranges[j]);
    dst.copy_from(host_flat.slice(0, off, off + counts[j]).reshape(shape_of(ranges[j])));
    off += counts[j];
  }
  return out;
}

}  // namespace

// ---- ShardedArray ------------------------------------------------------------------------------------------------

ShardedArray::ShardedArray(Shape global_shape, NamedSharding sharding, Array local)
    : shape_(std::move(global_shape)), sharding_(std::move(sharding)), local_(std::move(local)) {
  sharding_.validate(shape_);
  const Shape want = sharding_.local_shape(shape_, sharding_.mesh().rank());
  SHARDKIT_CHECK(local_.shape() == want, "local block of shape ", shape_to_string(local_.shape()), " on rank ",
                 sharding_.mesh().rank(), " does not match ", sharding_.to_string(), " of global shape ",
                 shape_to_string(shape_), " (expected ", shape_to_string(want), ")");
}

std::string ShardedArray::describe() const {
  return detail::concat("ShardedArray(shape=", shape_to_string(shape_), ", dtype=", dtype(), ", ",
                        sharding_.to_string(), ", local=", shape_to_string(local_.shape()), " on ", device(), ")");
}

ShardedArray from_local(Array local, Shape global_shape, const NamedSharding& sharding) {
  return ShardedArray(std::move(global_shape), sharding, std::move(local));
}

// ---- distribute / gather -------------------------------------------------------------------------------------------

ShardedArray distribute(const Array& global, const NamedSharding& sharding, int root, std::optional<Device> device) {
  Communicator& comm = *sharding.mesh().comm();
  SHARDKIT_CHECK(root >= 0 && root < comm.size(), "distribute: root ", root, " out of range for ", comm.size(),
                 " ranks");
  const Device target = device.value_or(default_device());
  const bool is_root = comm.rank() == root;
  // Shape and dtype travel from the root, so other ranks need not know them.
  Array meta = Array::zeros({kMaxDims + 2}, DType::kInt64);
  if (is_root) {
    SHARDKIT_CHECK(global.ndim() <= kMaxDims, "distribute: rank ", global.ndim(), " above ", kMaxDims);
    auto* m = meta.data_as<std::int64_t>();
    m[0] = global.ndim();
    m[1] = static_cast<std::int64_t>(global.dtype());
    for (int d = 0; d < global.ndim(); ++d) m[2 + d] = global.dim(d);
  }
  comm.bcast_inplace(meta, root).wait();
  const auto* m = meta.data_as<std::int64_t>();
  const Shape shape(m + 2, m + 2 + m[0]);
  const auto dtype = static_cast<DType>(m[1]);
  sharding.validate(shape);

  if (sharding.fully_replicated()) {
    Array buf = is_root ? global.to(target).clone() : Array::empty(shape, dtype, target);
    comm.bcast_inplace(buf, root).wait();
    return ShardedArray(shape, sharding, buf);
  }
  // The root packs every rank's block, in rank order; one all-to-all-v where only the root sends.
  const int p = comm.size();
  std::vector<std::int64_t> send_counts(p, 0), recv_counts(p, 0);
  const Shape mine = sharding.local_shape(shape, comm.rank());
  recv_counts[root] = shape_numel(mine);
  Array send = Array::empty({0}, dtype);
  if (is_root) {
    const Array host = global.to(Device::cpu());
    std::int64_t total = 0;
    for (int r = 0; r < p; ++r) total += send_counts[r] = numel_of(sharding.index(shape, r));
    send = Array::empty({total}, dtype);
    std::int64_t off = 0;
    for (int r = 0; r < p; ++r) {
      const auto idx = sharding.index(shape, r);
      Array dst = send.slice(0, off, off + send_counts[r]).reshape(shape_of(idx));
      dst.copy_from(block_of(host, idx));
      off += send_counts[r];
    }
  }
  // Host buffers on every rank (the MPI backend), then each block moves to its device.
  Array recv = Array::empty({recv_counts[root]}, dtype);
  comm.alltoallv(send, send_counts, recv, recv_counts).wait();
  return ShardedArray(shape, sharding, recv.reshape(mine).to(target));
}

Array gather(const ShardedArray& x, int root) {
  const NamedSharding& s = x.sharding();
  Communicator& comm = *s.mesh().comm();
  SHARDKIT_CHECK(root >= 0 && root < comm.size(), "gather: root ", root, " out of range for ", comm.size(), " ranks");
  const int p = comm.size();
  // Only the first copy of each block travels.
  std::vector<std::int64_t> send_counts(p, 0), recv_counts(p, 0);
  std::vector<std::vector<IndexRange>> ranges(p);
  for (int r = 0; r < p; ++r) {
    ranges[r] = s.index(x.shape(), r);
    if (s.is_primary(r)) recv_counts[r] = numel_of(ranges[r]);
  }
  if (comm.rank() != root) recv_counts.assign(p, 0);
  const bool send_mine = s.is_primary(comm.rank());
  Array send = send_mine ? x.local().to(Device::cpu()).reshape({x.local().numel()}) : Array::empty({0}, x.dtype());
  send_counts[root] = send.numel();
  Array recv = Array::empty({std::accumulate(recv_counts.begin(), recv_counts.end(), std::int64_t{0})}, x.dtype());
  comm.alltoallv(send, send_counts, recv, recv_counts).wait();
  if (comm.rank() != root) return Array();
  return assemble(x.shape(), x.dtype(), recv, ranges, recv_counts);
}

Array process_allgather(const ShardedArray& x) {
  const NamedSharding& s = x.sharding();
  Communicator& comm = *s.mesh().comm();
  if (s.fully_replicated()) return x.local().to(Device::cpu());
  const int p = comm.size();
  std::vector<std::int64_t> counts(p, 0);
  std::vector<std::vector<IndexRange>> ranges(p);
  for (int r = 0; r < p; ++r) {
    ranges[r] = s.index(x.shape(), r);
    if (s.is_primary(r)) counts[r] = numel_of(ranges[r]);
  }
  Array send = s.is_primary(comm.rank()) ? x.local().to(Device::cpu()).reshape({x.local().numel()})
                                        : Array::empty({0}, x.dtype());
  Array recv = Array::empty({std::accumulate(counts.begin(), counts.end(), std::int64_t{0})}, x.dtype());
  comm.allgatherv(send, recv, counts).wait();
  return assemble(x.shape(), x.dtype(), recv, ranges, counts);
}

// ---- visualize -------------------------------------------------------------------------------------------------------

std::string visualize_sharding(const Shape& global, const NamedSharding& sharding) {
  sharding.validate(global);
  const int p = static_cast<int>(sharding.mesh().size());
  // Blocks along the first two dimensions (a 0-d or 1-d array has one row).
  auto range_text = [](const IndexRange& r) { return std::to_string(r.start) + ":" + std::to_string(r.stop); };
  std::map<std::pair<std::int64_t, std::int64_t>, std::string> row_names, col_names;
  std::map<std::pair<std::pair<std::int64_t, std::int64_t>, std::pair<std::int64_t, std::int64_t>>, std::vector<int>> cells;
  for (int r = 0; r < p; ++r) {
    const auto idx = sharding.index(global, r);
    const IndexRange row = global.size() >= 2 ? idx[0] : IndexRange{0, 1};
    const IndexRange col = global.size() >= 2 ? idx[1] : global.size() == 1 ? idx[0] : IndexRange{0, 1};
    row_names[{row.start, row.stop}] = global.size() >= 2 ? "rows " + range_text(row) : "";
    col_names[{col.start, col.stop}] = global.empty() ? "scalar" : (global.size() >= 2 ? "cols " : "") + range_text(col);
    cells[{{row.start, row.stop}, {col.start, col.stop}}].push_back(r);
  }
  auto cell_text = [&](const std::vector<int>& ranks) {
    std::string s = ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      if (i) s += ',';
      s += std::to_string(ranks[i]);
    }
    return s;
  };
  std::size_t width = 0, label = 0;
  for (const auto& [k, ranks] : cells) width = std::max(width, cell_text(ranks).size());
  for (const auto& [k, n] : col_names) width = std::max(width, n.size());
  for (const auto& [k, n] : row_names) label = std::max(label, n.size());
  std::ostringstream os;
  os << sharding.to_string() << " of shape " << shape_to_string(global) << "\n";
  const std::string pad(label + (label ? 1 : 0), ' ');
  std::string rule = pad + "+";
  for (std::size_t c = 0; c < col_names.size(); ++c) rule += std::string(width + 2, '-') + "+";
  os << pad << " ";
  for (const auto& [k, n] : col_names) os << " " << n << std::string(width - n.size() + 1, ' ') << " ";
  os << "\n" << rule << "\n";
  for (const auto& [rk, rn] : row_names) {
    os << rn << std::string(label - rn.size(), ' ') << (label ? " " : "") << "|";
    for (const auto& [ck, cn] : col_names) {
      const auto it = cells.find({rk, ck});
      const std::string t = it == cells.end() ? "" : cell_text(it->second);
      os << " " << t << std::string(width - t.size(), ' ') << " |";
    }
    os << "\n" << rule << "\n";
  }
  if (global.size() > 2) os << "(dimensions 2 and up: " << sharding.spec().to_string() << ")\n";
  return os.str();
}

}  // namespace shardkit
