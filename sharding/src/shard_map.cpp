#include "shardkit/sharding/shard_map.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "layout.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit {
namespace {

Array finish(Array out, const Token& t) {
  if (t.waitable()) out.set_ready(t.waitable());
  return out;
}

// Divides every element by n (pmean), on the host.
void divide(Array& x, std::int64_t n) {
  Array host = x.to(Device::cpu());
  if (host.data() == x.data()) host = x.clone();
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(host.data());
    for (std::int64_t i = 0; i < host.numel(); ++i) {
      if constexpr (std::is_same_v<T, Half>)
        p[i] = float_to_half(half_to_float(p[i]) / static_cast<float>(n));
      else if constexpr (std::is_same_v<T, BFloat16>)
        p[i] = float_to_bfloat16(bfloat16_to_float(p[i]) / static_cast<float>(n));
      else if constexpr (std::is_floating_point_v<T>)
        p[i] = p[i] / static_cast<T>(n);
      else if constexpr (requires { p[i].real(); })
        p[i] = p[i] / static_cast<typename T::value_type>(n);
    }
  });
  x.copy_from(host);
}

// A host copy of a bool or integer array converted to `to` (float32, float64 or int32), element by element.
Array convert_integers(const Array& x, DType to) {
  const Array src = detail::packed(x.to(Device::cpu()));
  Array out = Array::empty(src.shape(), to);
  visit_dtype(src.dtype(), [&](auto s) {
    using S = decltype(s);
    visit_dtype(to, [&](auto d) {
      using D = decltype(d);
      if constexpr (std::is_integral_v<S> && (std::is_same_v<D, float> || std::is_same_v<D, double> ||
                                              std::is_same_v<D, std::int32_t>)) {
        const S* p = static_cast<const S*>(src.data());
        D* q = static_cast<D*>(out.data());
        for (std::int64_t i = 0; i < src.numel(); ++i) q[i] = static_cast<D>(p[i]);
      } else {
        SHARDKIT_ASSERT(false, "convert_integers: from an integer dtype to float32, float64 or int32");
      }
    });
  });
  return out;
}

// Applies shape moves: a moveaxis is a view; a reshape packs first where the view is not contiguous (a copy that
// waits for the array's ready event).
Array apply(Array v, const std::vector<ShapeMove>& moves) {
  for (const ShapeMove& m : moves) {
    if (m.from < 0) {
      v = detail::packed(v).reshape(m.shape);
      continue;
    }
    std::vector<int> order;
    for (int d = 0; d < v.ndim(); ++d)
      if (d != m.from) order.push_back(d);
    order.insert(order.begin() + m.to, m.from);
    v = v.permute(order);
  }
  return v;
}

}  // namespace

// ---- ShardContext --------------------------------------------------------------------------------------------------

Array ShardContext::run(AxisOp what, const Array& x, const Axes& axes, const AxisArgs& args) {
  const AxisPlan p = plan_axis(what, mesh_, axes, x.shape(), x.dtype(), args);
  const Array converted = p.input == x.dtype() ? x : convert_integers(x, p.input).to(x.device());
  const Array in = detail::packed(apply(converted, p.before));
  Array y;
  if (p.op) {
    auto comm = mesh_.axis_comm(axes);
    // The value form binds `in` as its rule says; send and sendrecv read it as their send buffer.
    OpArgs a{.send = &in, .reduce = p.reduce, .root = p.root, .dest = p.dest, .source = p.source,
             .send_tag = p.tag, .recv_tag = p.tag, .peers = p.peers};
    if (value_rule(*p.op) == ValueRule::kNone) {
      token_ = comm->run(*p.op, a, token_);
    } else {
      auto [v, t] = comm->run_value(*p.op, in, a, token_);
      token_ = t;
      y = std::move(v);
    }
  }
  if (p.zeros) return finish(Array::zeros(p.shape, x.dtype(), x.device()), token_);
  y = detail::packed(apply(std::move(y), p.after));
  if (p.output != y.dtype()) y = convert_integers(y, p.output).to(x.device());
  if (p.divide != 1) divide(y, p.divide);
  return finish(std::move(y), token_);
}

Array ShardContext::psum(const Array& x, const Axes& axes) { return run(AxisOp::kPsum, x, axes); }
Array ShardContext::pmean(const Array& x, const Axes& axes) { return run(AxisOp::kPmean, x, axes); }
Array ShardContext::pmax(const Array& x, const Axes& axes) { return run(AxisOp::kPmax, x, axes); }
Array ShardContext::pmin(const Array& x, const Axes& axes) { return run(AxisOp::kPmin, x, axes); }

Array ShardContext::all_gather(const Array& x, const Axes& axes, int dim, bool tiled) {
  return run(AxisOp::kAllGather, x, axes, {.dim = dim, .tiled = tiled});
}

Array ShardContext::psum_scatter(const Array& x, const Axes& axes, int scatter_dim, bool tiled) {
  return run(AxisOp::kPsumScatter, x, axes, {.dim = scatter_dim, .tiled = tiled});
}

Array ShardContext::ppermute(const Array& x, const Axes& axes, const std::vector<std::pair<int, int>>& perm) {
  return run(AxisOp::kPpermute, x, axes, {.perm = perm});
}

Array ShardContext::all_to_all(const Array& x, const Axes& axes, int split_dim, int concat_dim, bool tiled) {
  return run(AxisOp::kAllToAll, x, axes, {.dim = split_dim, .concat_dim = concat_dim, .tiled = tiled});
}

Array ShardContext::pbroadcast(const Array& x, const Axes& axes, int source) {
  return run(AxisOp::kPbroadcast, x, axes, {.source = source});
}

// ---- shard_map ---------------------------------------------------------------------------------------------------------

namespace {

std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

// A hash of a block's shape, dtype and values. Floating values are hashed in a canonical form so that the hash compares
// values, not bytes: -0.0 as 0.0, every NaN as one NaN, float16 and bfloat16 through float.
std::uint64_t block_hash(const Array& a) {
  const Array host = detail::packed(a.to(Device::cpu()));
  std::uint64_t h = fnv1a(a.shape().data(), a.shape().size() * sizeof(std::int64_t));
  const auto dt = static_cast<std::uint8_t>(a.dtype());
  h = fnv1a(&dt, 1, h);
  if (!is_floating(a.dtype()) && !is_complex(a.dtype())) return fnv1a(host.data(), host.nbytes(), h);
  auto canonical = [](auto v) {
    if (v != v) return std::numeric_limits<decltype(v)>::quiet_NaN();
    return v == 0 ? decltype(v){0} : v;
  };
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(host.data());
    for (std::int64_t i = 0; i < host.numel(); ++i) {
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
        float f;
        if constexpr (std::is_same_v<T, Half>)
          f = canonical(half_to_float(p[i]));
        else
          f = canonical(bfloat16_to_float(p[i]));
        h = fnv1a(&f, sizeof f, h);
      } else if constexpr (std::is_floating_point_v<T>) {
        const T v = canonical(p[i]);
        h = fnv1a(&v, sizeof v, h);
      } else if constexpr (requires { p[i].real(); }) {
        const typename T::value_type parts[2] = {canonical(p[i].real()), canonical(p[i].imag())};
        h = fnv1a(parts, sizeof parts, h);
      }
    }
  });
  return h;
}

// Mesh axes of size > 1 that `spec` does not name: the output must be equal along them.
std::vector<std::string> promised_axes(const Mesh& mesh, const PartitionSpec& spec) {
  std::vector<std::string> out;
  for (const std::string& a : NamedSharding(mesh, spec).replicated_axes())
    if (mesh.axis_size(a) > 1) out.push_back(a);
  return out;
}

// Checks out_specs' replication promises of every output: ranks that differ only along axes an out_spec does not
// name must hold equal blocks. One allgather of the hashes of the outputs that promise something (none at one rank,
// or when every out_spec names every axis); every rank reaches the same verdict.
void check_replication(const Mesh& mesh, const std::vector<PartitionSpec>& out_specs, const std::vector<Array>& outs) {
  Communicator& comm = *mesh.comm();
  const int p = comm.size();
  if (p == 1) return;
  std::vector<std::size_t> checked;
  std::vector<std::vector<std::string>> free_axes;
  for (std::size_t i = 0; i < outs.size(); ++i) {
    std::vector<std::string> f = promised_axes(mesh, out_specs[i]);
    if (f.empty()) continue;
    checked.push_back(i);
    free_axes.push_back(std::move(f));
  }
  if (checked.empty()) return;
  const auto n = static_cast<std::int64_t>(checked.size());
  std::vector<std::uint64_t> mine(checked.size());
  for (std::size_t k = 0; k < checked.size(); ++k) mine[k] = block_hash(outs[checked[k]]);
  Array send = Array::from_values<std::uint64_t>(std::span<const std::uint64_t>(mine));
  Array all = Array::empty({p * n}, DType::kUInt64);
  comm.allgather(send, all).wait();
  const auto* h = all.data_as<std::uint64_t>();
  for (std::size_t k = 0; k < checked.size(); ++k) {
    const std::size_t i = checked[k];
    // Compare each rank with the rank that has coordinate 0 on every unnamed axis.
    for (int r = 0; r < p; ++r) {
      std::vector<std::int64_t> c = mesh.coords(r);
      for (const auto& a : free_axes[k]) c[mesh.axis_position(a)] = 0;
      const int base = mesh.rank_at(c);
      if (h[r * n + static_cast<std::int64_t>(k)] != h[base * n + static_cast<std::int64_t>(k)]) {
        std::string names;
        for (const auto& a : free_axes[k]) names += (names.empty() ? "'" : ", '") + a + "'";
        throw InvalidArgument(detail::concat(
            "shard_map: out_specs[", i, "] = ", out_specs[i].to_string(), " promises that output ", i,
            " is replicated over mesh axes ", names, ", but ranks ", base, " and ", r,
            " (which differ only along them) produced different blocks. Name the axis in the out_spec, make the "
            "blocks equal (e.g. with psum), or turn the check off (check_vma=False in Python, check_rep=false in C++)"));
      }
    }
  }
}

}  // namespace

std::vector<ShardedArray> shard_map(const ShardFn& f, const Mesh& mesh, const std::vector<PartitionSpec>& in_specs,
                                    const std::vector<PartitionSpec>& out_specs, const std::vector<ShardedArray>& args,
                                    ShardMapOptions options) {
  SHARDKIT_CHECK_EQ(in_specs.size(), args.size(), "shard_map: one in_spec per argument (got ", in_specs.size(),
                    " in_specs for ", args.size(), " arguments)");
  std::vector<Array> blocks;
  bool uneven = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    SHARDKIT_CHECK(args[i].mesh() == mesh, "shard_map: argument ", i, " lives on ", args[i].mesh().to_string(),
                   ", not on the shard_map's ", mesh.to_string());
    uneven = uneven || args[i].sharding().uneven();
    const NamedSharding want(mesh, in_specs[i], args[i].sharding().uneven());
    want.validate(args[i].shape());
    blocks.push_back(args[i].sharding() == want ? args[i].local() : reshard(args[i], want).local());
  }
  ShardContext ctx(mesh);
  // out_specs is read only once f has returned: the Python binding fills it from what the body returns.
  std::vector<Array> outs = f(ctx, std::span<const Array>(blocks));
  ctx.token().wait();
  SHARDKIT_CHECK_EQ(outs.size(), out_specs.size(), "shard_map: the function returned ", outs.size(),
                    " outputs for ", out_specs.size(), " out_specs");
  if (options.check_rep) check_replication(mesh, out_specs, outs);

  std::vector<ShardedArray> result;
  for (std::size_t j = 0; j < outs.size(); ++j) {
    const NamedSharding s(mesh, out_specs[j], uneven);
    SHARDKIT_CHECK(out_specs[j].size() <= static_cast<std::size_t>(outs[j].ndim()), "shard_map: out_specs[", j,
                   "] = ", out_specs[j].to_string(), " is longer than the rank ", outs[j].ndim(), " of output ", j);
    Shape global = outs[j].shape();
    if (!uneven) {
      for (std::size_t d = 0; d < global.size(); ++d) global[d] *= s.num_shards(static_cast<int>(d));
    } else {
      // Uneven blocks: the global extent along a sharded dimension is the sum of the blocks along it.
      for (std::size_t d = 0; d < out_specs[j].size(); ++d) {
        if (s.num_shards(static_cast<int>(d)) == 1) continue;
        auto comm = mesh.axis_comm(out_specs[j].axes(d));
        auto [sum, t] = comm->allreduce(Array::from_values<std::int64_t>({outs[j].dim(static_cast<int>(d))}),
                                        ReduceOp::kSum);
        global[d] = sum.to_vector<std::int64_t>()[0];
      }
    }
    result.emplace_back(global, s, outs[j]);
  }
  return result;
}

}  // namespace shardkit
