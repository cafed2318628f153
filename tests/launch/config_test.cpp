#include "shardkit/launch/config.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "shardkit/core/error.hpp"

namespace shardkit {
namespace {

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"SHARDKIT_BACKEND", "SHARDKIT_CHECK", "SHARDKIT_TIMEOUT_S", "SHARDKIT_VERBOSE",
                          "SHARDKIT_SHM_SINGLE_COPY", "SHARDKIT_TRACE", "SHARDKIT_HANG_WARN_S", "SHARDKIT_DUMP_DIR",
                          "SHARDKIT_DUMP_WAIT_S", "SHARDKIT_TRACE_BUFFER", "SHARDKIT_SHM_PENDING_BYTES",
                          "SHARDKIT_STAGING_POOL_MB", "SHARDKIT_HANDLE_SIGNALS"})
      unsetenv(v);
  }
};

TEST_F(ConfigTest, Defaults) {
  const Config c = Config::from_env();
  EXPECT_EQ(c.comm.backend, BackendKind::kAuto);
  EXPECT_FALSE(c.comm.check);
  EXPECT_EQ(c.comm.timeout.count(), 0);
  EXPECT_EQ(c.process.hang_warn.count(), 300000);
  EXPECT_EQ(c.process.dump_wait.count(), 2000);
  EXPECT_EQ(c.process.dump_dir, "");
}

TEST_F(ConfigTest, ParsesEnvironment) {
  setenv("SHARDKIT_BACKEND", "nccl", 1);
  setenv("SHARDKIT_CHECK", "1", 1);
  setenv("SHARDKIT_TIMEOUT_S", "2.5", 1);
  const Config c = Config::from_env();
  EXPECT_EQ(c.comm.backend, BackendKind::kNccl);
  EXPECT_TRUE(c.comm.check);
  EXPECT_EQ(c.comm.timeout.count(), 2500);
  EXPECT_STREQ(backend_name(c.comm.backend), "nccl");
  setenv("SHARDKIT_BACKEND", "shm", 1);
  EXPECT_EQ(Config::from_env().comm.backend, BackendKind::kShm);
  EXPECT_STREQ(backend_name(BackendKind::kShm), "shm");
}

TEST_F(ConfigTest, ParsesTheFlightRecordersVariables) {
  setenv("SHARDKIT_HANG_WARN_S", "0.5", 1);
  setenv("SHARDKIT_DUMP_WAIT_S", "0", 1);
  setenv("SHARDKIT_DUMP_DIR", "/tmp/dumps here", 1);
  const Config c = Config::from_env();
  EXPECT_EQ(c.process.hang_warn.count(), 500);
  EXPECT_EQ(c.process.dump_wait.count(), 0);
  EXPECT_EQ(c.process.dump_dir, "/tmp/dumps here");
  for (const char* v : {"SHARDKIT_HANG_WARN_S", "SHARDKIT_DUMP_WAIT_S"}) {
    setenv(v, "soon", 1);
    EXPECT_THROW(Config::from_env(), InvalidArgument) << v;
    setenv(v, "-2", 1);
    EXPECT_THROW(Config::from_env(), InvalidArgument) << v;
    unsetenv(v);
  }
}

// Counts: the flight recorder's ring (SHARDKIT_TRACE_BUFFER) and the bound on an shm rank's held-back eager sends
// (SHARDKIT_SHM_PENDING_BYTES), each with its default, a value, 0, and what is refused.
TEST_F(ConfigTest, ParsesCounts) {
  EXPECT_EQ(Config::from_env().comm.trace_buffer, 2000u);
  EXPECT_EQ(Config::from_env().comm.shm_pending_bytes, std::size_t{8} << 20);
  EXPECT_EQ(Config::from_env().process.staging_pool_bytes, std::size_t{256} << 20);
  setenv("SHARDKIT_STAGING_POOL_MB", "3", 1);
  EXPECT_EQ(Config::from_env().process.staging_pool_bytes, std::size_t{3} << 20);
  setenv("SHARDKIT_TRACE_BUFFER", "0", 1);
  setenv("SHARDKIT_SHM_PENDING_BYTES", "65536", 1);
  Config c = Config::from_env();
  EXPECT_EQ(c.comm.trace_buffer, 0u);
  EXPECT_EQ(c.comm.shm_pending_bytes, 65536u);
  for (const char* v : {"SHARDKIT_TRACE_BUFFER", "SHARDKIT_SHM_PENDING_BYTES", "SHARDKIT_STAGING_POOL_MB"}) {
    for (const char* bad : {"-1", "many", "12k", "99999999999999999"}) {
      setenv(v, bad, 1);
      try {
        Config::from_env();
        ADD_FAILURE() << v << "=" << bad << " was accepted";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(v), std::string::npos) << e.what();
      }
    }
    unsetenv(v);
  }
}

TEST_F(ConfigTest, RejectsMalformedValues) {
  setenv("SHARDKIT_BACKEND", "gloo", 1);
  EXPECT_THROW(Config::from_env(), InvalidArgument);
  unsetenv("SHARDKIT_BACKEND");
  setenv("SHARDKIT_TIMEOUT_S", "-1", 1);
  EXPECT_THROW(Config::from_env(), InvalidArgument);
  setenv("SHARDKIT_TIMEOUT_S", "10s", 1);
  EXPECT_THROW(Config::from_env(), InvalidArgument);
  unsetenv("SHARDKIT_TIMEOUT_S");
  setenv("SHARDKIT_CHECK", "maybe", 1);
  EXPECT_THROW(Config::from_env(), InvalidArgument);
}

// SHARDKIT_TRACE names a directory; the words that turn things off turn it off, those that turn things on are refused
// (they would make a directory named "1").
TEST_F(ConfigTest, TraceNamesADirectory) {
  EXPECT_EQ(Config::from_env().process.trace_dir, "");
  setenv("SHARDKIT_TRACE", "traces/job 7", 1);
  EXPECT_EQ(Config::from_env().process.trace_dir, "traces/job 7");
  for (const char* off : {"0", "off", "false", "no"}) {
    setenv("SHARDKIT_TRACE", off, 1);
    EXPECT_EQ(Config::from_env().process.trace_dir, "") << off;
  }
  setenv("SHARDKIT_TRACE", "1", 1);
  try {
    (void)Config::from_env();
    ADD_FAILURE() << "SHARDKIT_TRACE=1 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("SHARDKIT_TRACE='1': expected the directory"), std::string::npos) << e.what();
  }
}

// The environment only fills defaults: what Config::set (or the first Config::get, from the environment) applies is
// what every CommOptions made afterwards starts from, and the process's settings; a field given is kept.
TEST_F(ConfigTest, SetFillsTheCollectivesDefaults) {
  const Config saved = Config::get();
  Config c;
  c.comm.check = true;
  c.comm.backend = BackendKind::kMpi;
  c.comm.trace_buffer = 7;
  c.process.dump_dir = "elsewhere";
  Config::set(c);
  EXPECT_TRUE(Config::get().comm.check);
  EXPECT_EQ(Config::get().process.dump_dir, "elsewhere");
  EXPECT_EQ(ProcessSettings::current().dump_dir, "elsewhere");
  const CommOptions made;
  EXPECT_TRUE(made.check);
  EXPECT_EQ(made.backend, BackendKind::kMpi);
  EXPECT_EQ(made.trace_buffer, 7u);
  EXPECT_EQ(made.name, "world");
  const CommOptions given{.backend = BackendKind::kShm, .name = "given"};
  EXPECT_EQ(given.backend, BackendKind::kShm);
  EXPECT_TRUE(given.check);
  Config::set(Config{});
  EXPECT_FALSE(Config::get().comm.check);
  EXPECT_FALSE(CommOptions{}.check);
  EXPECT_EQ(CommOptions{}.trace_buffer, CommOptions::builtin().trace_buffer);
  Config::set(saved);
}

}  // namespace
}  // namespace shardkit
