#include "shardkit/sharding/axis_plan.hpp"

#include <array>
#include <set>

#include "shardkit/core/error.hpp"

namespace shardkit {
namespace {

constexpr std::array<const char*, kAxisOpCount> kNames = {
    "psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute", "all_to_all", "pbroadcast"};

[[noreturn]] void refuse(const auto&... parts) {
  throw InvalidArgument(detail::concat(parts...));
}

// A dimension in [-range, range) as an index; `rank` is the block's, for the message.
int normalize(int dim, int range, AxisOp what, int rank) {
  const int d = dim < 0 ? dim + range : dim;
  if (d < 0 || d >= range) refuse(axis_op_name(what), ": dimension ", dim, " out of range for a block of rank ", rank);
  return d;
}

// x.shape[dim] must split over the n members: equal n (untiled), or divide by n (tiled).
void check_split(AxisOp what, const Shape& shape, int dim, std::int64_t n, bool tiled, const Axes& axes) {
  const std::int64_t s = shape[dim];
  if (tiled && s % n != 0)
    refuse(axis_op_name(what), ": dimension ", dim, " of size ", s, " is not divisible by ", n, ", the size of axes ",
           axes.to_string());
  if (!tiled && s != n)
    refuse(axis_op_name(what), " (tiled=False): dimension ", dim, " of size ", s, " must equal ", n,
           ", the size of axes ", axes.to_string());
}

void move(std::vector<ShapeMove>& moves, Shape& shape, int from, int to) {
  if (from == to) return;
  const std::int64_t d = shape[from];
  shape.erase(shape.begin() + from);
  shape.insert(shape.begin() + to, d);
  moves.push_back({from, to, {}});
}

void reshape(std::vector<ShapeMove>& moves, Shape& shape, Shape to) {
  shape = std::move(to);
  moves.push_back({-1, -1, shape});
}

// Splits dimension 0 of `shape` into (n, shape[0] / n).
void split_leading(std::vector<ShapeMove>& moves, Shape& shape, std::int64_t n) {
  Shape s = shape;
  s[0] /= n;
  s.insert(s.begin(), n);
  reshape(moves, shape, std::move(s));
}

// Merges dimensions d and d + 1 of `shape`.
void merge(std::vector<ShapeMove>& moves, Shape& shape, int d) {
  Shape s = shape;
  s[d] *= s[d + 1];
  s.erase(s.begin() + d + 1);
  reshape(moves, shape, std::move(s));
}

// Removes dimension d (of size 1) of `shape`.
void drop(std::vector<ShapeMove>& moves, Shape& shape, int d) {
  Shape s = shape;
  s.erase(s.begin() + d);
  reshape(moves, shape, std::move(s));
}

void plan_ppermute(AxisPlan& p, const Axes& axes, std::int64_t n, std::int64_t me, const AxisArgs& args) {
  std::set<int> sources, dests;
  auto bad = [&](const auto&... why) {
    std::string pairs;
    for (const auto& [s, d] : args.perm) pairs += detail::concat(pairs.empty() ? "" : ", ", "(", s, ", ", d, ")");
    refuse("ppermute: [", pairs, "] is not a permutation of the indices 0..", n - 1, " of axes ", axes.to_string(),
           ": ", why...);
  };
  for (const auto& [src, dst] : args.perm) {
    if (src < 0 || src >= n || dst < 0 || dst >= n) bad("pair (", src, ", ", dst, ") is out of range");
    if (!sources.insert(src).second) bad("source ", src, " appears twice");
    if (!dests.insert(dst).second) bad("destination ", dst, " appears twice");
    if (src == me) p.dest = dst;
    if (dst == me) p.source = src;
  }
  p.op = exchange_op(p.dest, p.source);
  p.peers = std::ssize(sources) == n ? Peers::kAllSendrecv : Peers::kMixed;
  p.zeros = p.source < 0;
}

}  // namespace

AxisReduction axis_reduction(ReduceOp op, DType dtype, const char* name) {
  if (dtype == DType::kBool) {
    if (op == ReduceOp::kSum) return {ReduceOp::kSum, DType::kInt32};
    if (op == ReduceOp::kMax) return {ReduceOp::kLogicalOr, DType::kBool};
    if (op == ReduceOp::kMin) return {ReduceOp::kLogicalAnd, DType::kBool};
  }
  if (!reduce_op_supports(op, dtype)) refuse(name, ": not defined for dtype ", dtype);
  return {op, dtype};
}

const char* axis_op_name(AxisOp op) noexcept {
  return kNames[static_cast<std::size_t>(op)];
}

AxisOp axis_op_from_name(std::string_view name) {
  for (int i = 0; i < kAxisOpCount; ++i)
    if (name == kNames[static_cast<std::size_t>(i)]) return static_cast<AxisOp>(i);
  refuse("'", name, "' is not an axis collective");
}

std::optional<OpKind> exchange_op(int dest, int source) noexcept {
  if (dest >= 0 && source >= 0) return OpKind::kSendrecv;
  if (dest >= 0) return OpKind::kSend;
  if (source >= 0) return OpKind::kRecv;
  return std::nullopt;
}

AxisPlan plan_axis(AxisOp what, const Mesh& mesh, const Axes& axes, const Shape& shape, DType dtype,
                   const AxisArgs& args) {
  const std::int64_t n = mesh.axis_size(axes);
  const int ndim = static_cast<int>(shape.size());
  AxisPlan p;
  p.what = what;
  p.input = p.output = dtype;
  Shape s = shape;  // the shape as it moves
  switch (what) {
    case AxisOp::kPsum:
    case AxisOp::kPmean:
    case AxisOp::kPmax:
    case AxisOp::kPmin: {
      const ReduceOp op = what == AxisOp::kPmax   ? ReduceOp::kMax
                          : what == AxisOp::kPmin ? ReduceOp::kMin
                                                  : ReduceOp::kSum;
      const AxisReduction r = axis_reduction(op, dtype, what == AxisOp::kPmean ? "pmean" : axis_op_name(what));
      p.op = OpKind::kAllreduce;
      p.reduce = r.op;
      p.input = p.output = r.input;
      if (what == AxisOp::kPmean) {
        // JAX's pmean is psum(x) / n: floating and complex dtypes keep theirs; integers (bool counted as int32) give
        // the division's promotion with 64-bit types enabled: float64 for 64-bit integers, float32 for the others.
        if (!is_floating(dtype) && !is_complex(dtype))
          p.output = dtype == DType::kInt64 || dtype == DType::kUInt64 ? DType::kFloat64 : DType::kFloat32;
        p.divide = n;
      }
      break;
    }
    case AxisOp::kAllGather: {
      // The table's allgather stacks the blocks: (n, *x.shape); the stacked axis moves to `dim`, and merges with the
      // dimension after it when tiled.
      const int d = normalize(args.dim, ndim + (args.tiled ? 0 : 1), what, ndim);
      p.op = OpKind::kAllgather;
      s.insert(s.begin(), n);
      move(p.after, s, 0, d);
      if (args.tiled) merge(p.after, s, d);
      break;
    }
    case AxisOp::kPsumScatter: {
      // Dimension d to the front, split into (n, chunk); the table's reduce_scatter keeps this rank's chunk.
      const int d = normalize(args.dim, ndim, what, ndim);
      check_split(what, shape, d, n, args.tiled, axes);
      p.op = OpKind::kReduceScatter;
      move(p.before, s, d, 0);
      split_leading(p.before, s, n);
      s.erase(s.begin());
      move(p.after, s, 0, d);
      if (!args.tiled) drop(p.after, s, d);
      break;
    }
    case AxisOp::kAllToAll: {
      // Split dimension to the front as (n, chunk): row j goes to member j, and row j of the result came from it. The
      // rows' chunk dimension returns to its place; untiled, it (of size 1) goes and the rows' axis stands at
      // concat_dim; tiled, the rows' axis merges with concat_dim.
      const int sd = normalize(args.dim, ndim, what, ndim);
      const int cd = normalize(args.concat_dim, ndim, what, ndim);
      check_split(what, shape, sd, n, args.tiled, axes);
      p.op = OpKind::kAlltoall;
      move(p.before, s, sd, 0);
      split_leading(p.before, s, n);
      move(p.after, s, 1, sd + 1);
      if (!args.tiled) {
        drop(p.after, s, sd + 1);
        move(p.after, s, 0, cd);
      } else {
        move(p.after, s, 0, cd);
        merge(p.after, s, cd);
      }
      break;
    }
    case AxisOp::kPpermute:
      plan_ppermute(p, axes, n, mesh.axis_index(axes), args);
      break;
    case AxisOp::kPbroadcast:
      if (args.source < 0 || args.source >= n)
        refuse("pbroadcast: source ", args.source, " out of range for axes ", axes.to_string(), " of size ", n);
      p.op = OpKind::kBcast;
      p.root = args.source;
      break;
  }
  p.shape = std::move(s);
  return p;
}

}  // namespace shardkit
