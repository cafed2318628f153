#pragma once
// Removals that no save waits for: old steps that keep_last drops and what earlier saves left behind are renamed out
// of the steps' names by the save (so readers never see them), then removed here, on a thread of the process's own,
// so that a save returns once its step is committed (removing a large step can take as long as writing one: a file
// system mounted with `discard` trims every extent as it frees it).

#include <cstddef>
#include <string>

namespace shardkit::checkpoint::detail {

/// Queues `path` (a file or a directory tree that no reader looks at any more) for removal on the background thread.
/// A removal that fails is a warning on stderr: what it left is a temporary directory, which the next save queues.
void remove_later(std::string path);

/// Returns once every queued removal has finished (wait_for_saves() calls it; so does the process's exit).
void drain_removals();

/// How many removals are queued or under way.
std::size_t removals_pending();

/// Lowers the calling thread's priority by `by` (added to its nice value, at most 19): the background threads of
/// saves (the writer, the janitor), so that a rank's compute keeps its core. Where the system refuses, it stays.
void lower_this_thread_priority(int by);

}  // namespace shardkit::checkpoint::detail
