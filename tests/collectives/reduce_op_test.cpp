// The reductions' names: one table (collectives/src/common.cpp) that every view reads. Every ReduceOp has a name of
// its own, which reduce_op_from_name takes back in any case; unknown names are refused with the list of valid ones.

#include <algorithm>
#include <cctype>
#include <set>
#include <string>

#include "collective_test_util.hpp"

namespace shardkit::testing {
namespace {

// The names as the API documents them (mpi4jax's and MPI's, lower case), in ReduceOp order.
const char* const kDocumentedNames[] = {"sum", "prod", "min", "max", "land", "lor", "lxor", "band", "bor", "bxor"};
static_assert(std::size(kDocumentedNames) == kReduceOpCount, "every reduction is listed");

std::string upper(std::string s) {
  std::ranges::transform(s, s.begin(), [](char c) { return static_cast<char>(std::toupper(c)); });
  return s;
}

TEST(ReduceOpNames, EveryReductionRoundTrips) {
  std::set<std::string> seen;
  for (int i = 0; i < kReduceOpCount; ++i) {
    const auto op = static_cast<ReduceOp>(i);
    const std::string name = reduce_op_name(op);
    SCOPED_TRACE(::testing::Message() << "ReduceOp " << i << " '" << name << "'");
    EXPECT_EQ(name, kDocumentedNames[i]);
    EXPECT_TRUE(seen.insert(name).second) << "two reductions are named '" << name << "'";
    EXPECT_EQ(reduce_op_from_name(name), op);
    EXPECT_EQ(reduce_op_from_name(upper(name)), op);  // mpi4py's and ReduceOp's spelling
    EXPECT_NE(reduce_op_names().find(name), std::string::npos) << reduce_op_names();
    EXPECT_NE(reduce_op_names(/*upper_case=*/true).find(upper(name)), std::string::npos);
  }
}

TEST(ReduceOpNames, UnknownNameListsTheValidOnes) {
  for (const char* bad : {"Median", "", "su", "sumx"}) {
    try {
      reduce_op_from_name(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const InvalidArgument& e) {
      std::string lowered(bad);
      std::ranges::transform(lowered, lowered.begin(), [](char c) { return static_cast<char>(std::tolower(c)); });
      EXPECT_EQ(std::string(e.what()),
                "unknown reduction '" + lowered + "' (sum, prod, min, max, land, lor, lxor, band, bor, bxor)");
    }
  }
}

}  // namespace
}  // namespace shardkit::testing
