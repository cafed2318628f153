// The seed's distributed multiply-by-two in C++: a global arange of 5 elements per rank, sharded P('x') over a 1-d
// mesh of every rank, a kernel doubling each local shard inside shard_map, and the gathered result printed by rank
// 0 next to a local reference. On a GPU the shards live in device memory and the kernel is a CUDA kernel.
//
// Run: mpirun -np 4 build/examples/multiply_by_two/multiply_by_two

#include <cstdio>

#include "array_compare.hpp"
#include "shardkit/core/kernels.hpp"
#include "shardkit/launch/runtime.hpp"
#include "shardkit/sharding/sharding.hpp"

int main(int argc, char** argv) {
  using namespace shardkit;
  try {
    Runtime rt(&argc, &argv);
    auto print0 = [&](const std::string& s) {
      if (rt.rank() == 0) std::printf("%s\n", s.c_str());
    };
    print0("Running on " + std::to_string(rt.size()) + " process(es), local shards on " + rt.device().to_string());
    print0("Test distributed multiplication using shardkit");

    const Mesh mesh = Mesh::line("x");
    const NamedSharding sharding(mesh, P("x"));
    const std::int64_t input_size = mesh.size() * 5;  // 5 elements per rank
    const Array global = Array::arange(input_size, DType::kFloat32);
    ShardedArray sharded = distribute(global, sharding);
    print0("Input array: " + process_allgather(sharded).to_string());

    auto result = shard_map(
        [](ShardContext&, std::span<const Array> in) {
          Array out = in[0].clone();  // the local shard: 5 elements, on this rank's device
          scale(out, 2.0);            // the kernel: a host loop, or a CUDA kernel for device memory
          return std::vector<Array>{out};
        },
        mesh, {P("x")}, {P("x")}, {sharded}, ShardMapOptions{.check_rep = false});

    const Array output = process_allgather(result[0]);
    print0("Output: " + output.to_string());
    Array reference = global.clone();
    scale(reference, 2.0);
    print0(std::string("allclose: ") + (allclose(output, reference) ? "true" : "false"));
    return allclose(output, reference) ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "multiply_by_two: %s\n", e.what());
    return 1;
  }
}
