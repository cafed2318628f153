#pragma once

#include <string>

#include "shardkit/collectives/options.hpp"

namespace shardkit {

/// The environment's settings, read in this one place: the defaults of every communicator's options (SHARDKIT_BACKEND,
/// SHARDKIT_CHECK, SHARDKIT_TIMEOUT_S, SHARDKIT_VERBOSE, SHARDKIT_TRACE_BUFFER, SHARDKIT_SHM_SINGLE_COPY,
/// SHARDKIT_SHM_PENDING_BYTES) and the process's settings of the collectives layer (SHARDKIT_HANG_WARN_S,
/// SHARDKIT_DUMP_DIR, SHARDKIT_DUMP_WAIT_S, SHARDKIT_TRACE, SHARDKIT_HANDLE_SIGNALS, SHARDKIT_STAGING_POOL_MB). What
/// each means: the fields of CommOptions and ProcessSettings (shardkit/collectives/options.hpp); the whole list:
/// docs/environment.md.
struct Config {
  /// What every communicator's options start from (CommOptions::defaults once applied).
  CommOptions comm = CommOptions::builtin();
  /// The collectives layer's process-wide settings (ProcessSettings::current once applied).
  ProcessSettings process;

  /// Parses the variables above over the built-in values. @throws InvalidArgument on a malformed value.
  static Config from_env();
  /// The configuration in force. On first use (the Runtime's start, or earlier) the environment's is applied:
  /// CommOptions::defaults and ProcessSettings::current are set from from_env(). @throws InvalidArgument as from_env.
  static Config get();
  /// Applies `config`: communicators made from now on start from config.comm, and the process's settings are
  /// config.process (tests, bindings). The environment is not read afterwards.
  static void set(const Config& config);
};

}  // namespace shardkit
