// bench_collectives: shardkit's collectives against the raw MPI calls underneath them, in the style of nccl-tests.
//
// For every operation and message size, the same host buffers go to shardkit's Communicator (buffer form, created
// with the fast-path options) and to the MPI call it stands for, issued on a separate duplicate of the Runtime's
// world communicator. Repeats alternate the two (shardkit, MPI, shardkit, MPI, ...) so that machine noise hits both
// alike. One measurement is a barrier, then `iters` back-to-back calls; its per-call time is the maximum over ranks.
// The table gives, per size, the min and median over the repeats of each side, algbw and busbw as nccl-tests defines
// them, and shardkit's overhead: the ratio shardkit / MPI (of the medians and of the mins) and the extra time.
//
// Layout (as nccl-tests: a harness and one file per collective): ../common/ holds the shared harness, bench.hpp the
// entry each collective fills (allreduce.cpp, allgather.cpp, ...), collective_test.cpp their table, options.cpp the
// flags and report.cpp the table and JSON.
//
// Run:  mpirun -np 2 bench_collectives --op all -b 8 -e 64M -f 2 -r 5 [--json results.json]
//       bench_collectives -h   lists every flag.

#include <algorithm>
#include <memory>
#include <optional>

#include "bench.hpp"
#include "output.hpp"
#include "report.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::bench {
namespace {

int run(const Runtime& rt, const Options& opt) {
  const bool root = rt.rank() == 0;
  std::FILE* table = table_stream(opt.json);

  std::shared_ptr<Communicator> comm = Communicator::world(rt, fast_comm_options(opt.checked));
  const MpiComm raw = MpiComm::dup(rt.world());
  const MpiComm control = MpiComm::dup(rt.world());
  const Bench b{opt,
                *comm,
                to_mpi<MPI_Comm>(raw.handle()),
                to_mpi<MPI_Comm>(control.handle()),
                *raw_datatype(opt.dtype),
                raw_op(opt.redop),
                rt.rank(),
                rt.size()};

  if (root) print_run_header(table, opt, rt, comm->options());
  std::vector<Row> rows;
  for (const CollectiveTest* c : opt.collectives) {
    if (root) print_table_header(table, *c, opt, rt.size());
    std::optional<Layout> last;
    for (std::int64_t bytes : message_sizes(opt)) {
      const Layout l = layout_for(*c, bytes, dtype_size(opt.dtype), rt.size());
      // Rounding to whole blocks can give the same buffers for neighbouring sizes: measure them once.
      if (last && last->send_count == l.send_count && last->recv_count == l.recv_count) continue;
      last = l;
      rows.push_back(c->run(b, l));
      rows.back().test = c;
      if (root) print_row(table, rows.back(), opt, rt.size());
    }
  }

  std::int64_t wrong = 0;
  for (const Row& r : rows) wrong += std::max<std::int64_t>(r.wrong, 0);
  if (root) {
    std::fprintf(table, "#\n# Summary (ratio = shardkit / MPI time; extra = shardkit - MPI time)\n");
    for (const CollectiveTest* c : opt.collectives) print_summary(table, *c, rows);
    if (opt.check)
      std::fprintf(table, "# Wrong results: %lld %s\n", static_cast<long long>(wrong), wrong ? "FAILED" : "OK");
    std::fflush(table);
    if (!opt.json.empty()) write_json(opt.json, json_report(opt, rt, comm->options(), rows));
  }
  return wrong ? 1 : 0;
}

}  // namespace
}  // namespace shardkit::bench

int main(int argc, char** argv) {
  return shardkit::bench::bench_main(argc, argv, "bench_collectives", shardkit::bench::usage_text(),
                                     shardkit::bench::parse_args, shardkit::bench::run);
}
