// The per-rank trace (collectives/src/trace_writer.hpp): every operation kept, in order, while the writer holds at most
// a chunk of them in memory, and the file valid JSON after every write. tests/python/test_trace.py runs whole traced
// jobs (SHARDKIT_TRACE at start-up, clock offsets, exit and timeouts) and the merge.

#include <stdlib.h>

#include <fstream>
#include <sstream>

#include "collective_test_util.hpp"
#include "trace_writer.hpp"

namespace shardkit::testing {
namespace {

std::string read(const std::string& path) {
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  return text.str();
}

TEST(TraceWriter, KeepsEveryOperationInOrderWritingAChunkAtATime) {
  char dir[] = "/tmp/shardkit-trace-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const ProcessSettings saved = ProcessSettings::current();
  ProcessSettings traced = saved;
  traced.trace_dir = dir;
  ProcessSettings::set(traced);
  // A communicator of this rank alone: its operations are local and quick, so the chunks fill long before the writer's
  // one-second write comes due.
  const std::shared_ptr<Communicator> self = world()->split(world()->rank(), 0, "self");
  ProcessSettings::set(saved);

  // Host buffers in every suite (the writer is the same whatever the backend; on the simulated GPU, 8000 NCCL
  // operations would take seconds). The GPU suites add one NCCL operation below.
  const int n = 2 * static_cast<int>(detail::kTraceChunk) + 5;
  Array x = Array::from_values<std::int32_t>({1, 2, 3});
  for (int k = 0; k < n; ++k) self->allreduce(x, ReduceOp::kSum).token.wait();
  const std::string path = detail::concat(dir, "/rank", world()->rank(), ".trace.json");
  const std::string before = read(path);
  // Two chunks are in the file (and the first operation, written at once); what is left in memory is less than one.
  EXPECT_GE(count_of(before, "\"ph\": \"X\""), n - static_cast<int>(detail::kTraceChunk) + 1);
  EXPECT_EQ(before.substr(before.size() - 4), "\n]}\n");  // valid JSON after each write

  ASSERT_EQ(detail::flush_trace(), path);
  const std::string after = read(path);
  EXPECT_EQ(count_of(after, "\"ph\": \"X\""), n);
  EXPECT_EQ(after.substr(after.size() - 4), "\n]}\n");
  // In order: the k-th span is the communicator's k-th operation, with its bytes and backend.
  std::size_t at = 0;
  const char* host = backend_name(self->backend_for(OpKind::kAllreduce, Device::cpu()));  // mpi, or shm when forced
  for (int k = 0; k < n; ++k) {
    at = after.find("\"name\": \"allreduce\"", at);
    ASSERT_NE(at, std::string::npos) << k;
    const std::string span = after.substr(at, after.find('\n', at) - at);
    ASSERT_NE(span.find(detail::concat("\"bytes\": 12, \"dtype\": \"int32\", \"count\": 3, \"backend\": \"", host,
                                       "\", \"communicator\": \"self\", \"seq\": ", k, ", \"id\": ", k, ",")),
              std::string::npos)
        << span;
    ++at;
  }
  if (on_gpu() && self->has_nccl()) {  // (ranks sharing one GPU: NCCL is refused and MPI moves device buffers)
    // An NCCL operation returns a pending token (a CUDA event): its span ends when the wait saw it complete.
    Array y = Array::from_values<double>({1, 2}).to(buffer_device());
    self->allreduce(y, ReduceOp::kSum).token.wait();
    detail::flush_trace();
    const std::string gpu = read(path);
    const std::string last = gpu.substr(gpu.rfind("{\"name\": \"allreduce\""));
    EXPECT_NE(last.find("\"bytes\": 16, \"dtype\": \"float64\", \"count\": 2, \"backend\": \"nccl\""),
              std::string::npos)
        << last;
    EXPECT_NE(last.find("\"end\": \"completed\""), std::string::npos) << last;
  }
  std::remove(path.c_str());
  ::rmdir(dir);
}

}  // namespace
}  // namespace shardkit::testing
