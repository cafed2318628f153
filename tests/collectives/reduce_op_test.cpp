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

// Every operation of the table: a name that op_from_name takes back, a named value rule, and value facts that agree
// with the shapes value_shape gives (what the JAX layer's batching reads).
TEST(OpTable, EveryOperationHasItsFacts) {
  std::set<std::string> seen;
  for (int i = 0; i < kOpCount; ++i) {
    const auto op = static_cast<OpKind>(i);
    const std::string name = op_name(op);
    SCOPED_TRACE(name);
    EXPECT_TRUE(seen.insert(name).second) << "two operations are named '" << name << "'";
    EXPECT_EQ(op_from_name(name), op);
    const ValueRule rule = value_rule(op);
    EXPECT_STRNE(value_rule_name(rule), "?");
    const OpTraits t = op_traits(op);
    EXPECT_FALSE(t.rooted && (t.has_dest || t.has_source)) << "rooted operations have no peers";
    if (rule == ValueRule::kNone || rule == ValueRule::kConcat) continue;
    for (int rank : {0, 1}) {  // the root (0) and another rank, of 3
      const Shape x{3, 2};
      const Shape out = value_shape(op, x, rank, 3, 0);
      if (value_stacks(op, rank, 0)) {
        EXPECT_EQ(out, (Shape{3, 3, 2}));
      }
      if (value_splits_leading(op, rank, 0)) {
        EXPECT_THROW(value_shape(op, {2, 2}, rank, 3, 0), InvalidArgument);  // the leading axis must be the size
        EXPECT_TRUE(out == x || out == Shape{2});
      }
      if (!value_stacks(op, rank, 0) && !value_splits_leading(op, rank, 0)) {
        EXPECT_EQ(out, x);
      }
    }
  }
  EXPECT_THROW(op_from_name("allreducex"), InvalidArgument);
}

}  // namespace
}  // namespace shardkit::testing
