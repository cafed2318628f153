#pragma once

// What the shm tests look for in /dev/shm: the segments a communicator's rank 0 makes are named
// "shardkit-<its pid>-<n>-<stamp>" (collectives/src/backends/shm/shm_segment.cpp).

#include <dirent.h>
#include <unistd.h>

#include <string>

namespace shardkit::testing {

/// Entries of /dev/shm named as this process's shm segments.
inline int own_shm_segments() {
  const std::string prefix = "shardkit-" + std::to_string(getpid()) + "-";
  int n = 0;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) ++n;
    closedir(d);
  }
  return n;
}

}  // namespace shardkit::testing
