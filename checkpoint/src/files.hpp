#pragma once
// The file-system calls of checkpoints, each raising BackendError (backend "filesystem", errno, the path) on failure.

#include <sys/uio.h>

#include <cstdint>
#include <string>
#include <vector>

namespace shardkit::checkpoint::detail {

/// An open file descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const noexcept { return fd_; }
  const std::string& path() const noexcept { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

/// Raises BackendError naming `what` and `path` with errno's message.
[[noreturn]] void raise_errno(const std::string& what, const std::string& path, int err);

/// Creates a directory and its parents (existing ones are fine).
void make_dirs(const std::string& path);
/// A file being written from its start: created (it must not exist), appended to, then finished (closed, with `sync`
/// fsynced first); dropped unfinished, it is closed as it is.
class NewFile {
 public:
  explicit NewFile(const std::string& path);
  /// Writes the pieces in order at the end of what is written, with as few calls as it can.
  void append(const std::vector<iovec>& pieces);
  void finish(bool sync);
  std::uint64_t size() const noexcept { return size_; }

 private:
  Fd fd_;
  std::uint64_t size_ = 0;
};

/// Creates `path` (which must not exist), writes the pieces in order with as few calls as it can, and with `sync`
/// fsyncs it before closing.
void write_new_file(const std::string& path, const std::vector<iovec>& pieces, bool sync);
/// Writes a small text file whole (replacing nothing: it must not exist), synced with `sync`.
void write_text_file(const std::string& path, const std::string& text, bool sync);
/// Reads a whole file.
std::string read_text_file(const std::string& path);
/// Opens a file to read.
Fd open_read(const std::string& path);
/// Reads exactly `size` bytes at `offset` into `dst` (a short file is an error naming it).
void read_at(const Fd& fd, void* dst, std::uint64_t size, std::uint64_t offset);
/// Reads into the pieces in order from `offset`.
void read_at(const Fd& fd, const std::vector<iovec>& pieces, std::uint64_t offset);
/// The size of an open file.
std::uint64_t file_size(const Fd& fd);
/// fsyncs a directory (so the entries made in it are durable).
void sync_dir(const std::string& path);
/// Renames (atomic within one file system).
void rename_path(const std::string& from, const std::string& to);
/// Removes a file or a directory tree; a missing path is fine.
void remove_tree(const std::string& path);
/// The names in a directory (not "." or ".."); none when it does not exist.
std::vector<std::string> list_dir(const std::string& path);
/// True when `path` exists.
bool exists(const std::string& path);
/// Every directory under `path` (itself included), parents before children.
std::vector<std::string> dirs_under(const std::string& path);

}  // namespace shardkit::checkpoint::detail
