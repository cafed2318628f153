// shard_map collectives on a 2-d mesh: psum over one axis, all_gather over the other, and a ring of ppermutes.
// The world is arranged as a (ranks/ny, ny) mesh with axes ('x', 'y'), ny = 2 when the rank count is even.
// Rank 0 prints each result (gathered) and whether it matches a reference computed from the global input.
//
// Run: mpirun -np 4 build/examples/shard_map_collectives/shard_map_collectives

#include <cstdio>

#include "array_compare.hpp"
#include "shardkit/launch/runtime.hpp"
#include "shardkit/sharding/sharding.hpp"

namespace {

using namespace shardkit;

// Host reference helpers on the global (gathered) array G of shape (rows, cols).
double at(const Array& g, std::int64_t i, std::int64_t j) { return g.data_as<double>()[i * g.dim(1) + j]; }

}  // namespace

int main(int argc, char** argv) {
  try {
    Runtime rt(&argc, &argv);
    const std::int64_t ny = rt.size() % 2 == 0 ? 2 : 1, nx = rt.size() / ny;
    const Mesh mesh({nx, ny}, {"x", "y"});
    const bool root = rt.rank() == 0;
    if (root) std::printf("%s over %d process(es)\n", mesh.to_string().c_str(), rt.size());

    // A (2*nx, 3*ny) global array, one (2, 3) block per rank.
    const std::int64_t rows = 2 * nx, cols = 3 * ny;
    const Array g = Array::arange(rows * cols, DType::kFloat64).reshape({rows, cols});
    const NamedSharding blocks(mesh, P("x", "y"));
    ShardedArray x = distribute(g, blocks);
    if (root) std::printf("input, sharded P('x', 'y'):\n%s\n%s\n", g.to_string().c_str(), visualize_sharding(x).c_str());

    auto out = shard_map(
        [&](ShardContext& ctx, std::span<const Array> in) {
          const Array& b = in[0];
          Array col_sum = ctx.psum(b, "x");                    // sum of the blocks in my column of the mesh
          Array row = ctx.all_gather(b, "y", /*dim=*/1, true);  // my row of blocks, side by side
          std::vector<std::pair<int, int>> ring;
          for (int i = 0; i < nx; ++i) ring.emplace_back(i, (i + 1) % nx);
          Array shifted = ctx.ppermute(b, "x", ring);           // the block of the rank above me (cyclically)
          return std::vector<Array>{col_sum, row, shifted};
        },
        mesh, {P("x", "y")}, {P(kNone, "y"), P("x"), P("x", "y")}, {x});

    const Array col_sum = process_allgather(out[0]), rows_g = process_allgather(out[1]),
                shifted = process_allgather(out[2]);
    // References from the global input.
    bool ok_sum = col_sum.shape() == Shape{2, cols}, ok_row = allclose(rows_g, g), ok_shift = true;
    for (std::int64_t i = 0; ok_sum && i < 2; ++i)
      for (std::int64_t j = 0; j < cols; ++j) {
        double s = 0;
        for (std::int64_t bx = 0; bx < nx; ++bx) s += at(g, bx * 2 + i, j);
        ok_sum = ok_sum && at(col_sum, i, j) == s;
      }
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j)
        ok_shift = ok_shift && at(shifted, i, j) == at(g, (i - 2 + rows) % rows, j);
    if (root) {
      std::printf("psum over 'x' (out_specs P(None, 'y')):\n%s\nmatches: %s\n\n", col_sum.to_string().c_str(),
                  ok_sum ? "true" : "false");
      std::printf("all_gather over 'y', tiled on dim 1 (out_specs P('x')):\n%s\nmatches: %s\n\n",
                  rows_g.to_string().c_str(), ok_row ? "true" : "false");
      std::printf("ppermute ring over 'x' (out_specs P('x', 'y')):\n%s\nmatches: %s\n", shifted.to_string().c_str(),
                  ok_shift ? "true" : "false");
      std::printf("all match: %s\n", ok_sum && ok_row && ok_shift ? "true" : "false");
    }
    return ok_sum && ok_row && ok_shift ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "shard_map_collectives: %s\n", e.what());
    return 1;
  }
}
