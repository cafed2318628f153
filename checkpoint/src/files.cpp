#include "files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "shardkit/core/error.hpp"

namespace shardkit::checkpoint::detail {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

void raise_errno(const std::string& what, const std::string& path, int err) {
  throw BackendError("filesystem", err, what + " '" + path + "': " + std::strerror(err));
}

void make_dirs(const std::string& path) {
  if (path.empty()) return;
  std::string partial;
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty() || partial == "/") continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) raise_errno("cannot create directory", partial, errno);
  }
}

namespace {

// The non-empty pieces, and after a call that moved `done` bytes, the first piece not yet whole and what is left of
// it: the loop of pwritev and preadv alike.
std::vector<iovec> nonempty(const std::vector<iovec>& pieces) {
  std::vector<iovec> out;
  out.reserve(pieces.size());
  for (const auto& v : pieces)
    if (v.iov_len > 0) out.push_back(v);
  return out;
}

void advance(std::vector<iovec>& rest, std::size_t& first, std::size_t done) {
  while (first < rest.size() && done >= rest[first].iov_len) done -= rest[first++].iov_len;
  if (done > 0) {
    rest[first].iov_base = static_cast<char*>(rest[first].iov_base) + done;
    rest[first].iov_len -= done;
  }
}

}  // namespace

NewFile::NewFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) raise_errno("cannot create", path, errno);
  fd_ = Fd(fd, path);
}

void NewFile::append(const std::vector<iovec>& pieces) {
  std::vector<iovec> rest = nonempty(pieces);
  std::size_t first = 0;
  while (first < rest.size()) {
    const int n = static_cast<int>(std::min<std::size_t>(rest.size() - first, IOV_MAX));
    const ssize_t w = ::pwritev(fd_.get(), rest.data() + first, n, static_cast<off_t>(size_));
    if (w < 0) {
      if (errno == EINTR) continue;
      raise_errno("cannot write", fd_.path(), errno);
    }
    size_ += static_cast<std::uint64_t>(w);
    advance(rest, first, static_cast<std::size_t>(w));
  }
}

void NewFile::finish(bool sync) {
  if (sync && ::fsync(fd_.get()) != 0) raise_errno("cannot sync", fd_.path(), errno);
  fd_ = Fd();
}

void write_new_file(const std::string& path, const std::vector<iovec>& pieces, bool sync) {
  NewFile f(path);
  f.append(pieces);
  f.finish(sync);
}

void write_text_file(const std::string& path, const std::string& text, bool sync) {
  write_new_file(path, {iovec{const_cast<char*>(text.data()), text.size()}}, sync);
}

Fd open_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) raise_errno("cannot open", path, errno);
  return Fd(fd, path);
}

std::string read_text_file(const std::string& path) {
  Fd f = open_read(path);
  const std::uint64_t n = file_size(f);
  std::string s(n, '\0');
  read_at(f, s.data(), n, 0);
  return s;
}

void read_at(const Fd& fd, void* dst, std::uint64_t size, std::uint64_t offset) {
  read_at(fd, {iovec{dst, size}}, offset);
}

void read_at(const Fd& fd, const std::vector<iovec>& pieces, std::uint64_t offset) {
  std::vector<iovec> rest = nonempty(pieces);
  std::size_t first = 0;
  while (first < rest.size()) {
    const int n = static_cast<int>(std::min<std::size_t>(rest.size() - first, IOV_MAX));
    const ssize_t r = ::preadv(fd.get(), rest.data() + first, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      raise_errno("cannot read", fd.path(), errno);
    }
    if (r == 0)
      throw BackendError("filesystem", 0,
                         "file '" + fd.path() + "' ends before byte " + std::to_string(offset) +
                             ": it is shorter than its index says (truncated?)");
    offset += static_cast<std::uint64_t>(r);
    advance(rest, first, static_cast<std::size_t>(r));
  }
}

std::uint64_t file_size(const Fd& fd) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) raise_errno("cannot stat", fd.path(), errno);
  return static_cast<std::uint64_t>(st.st_size);
}

void sync_dir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) raise_errno("cannot open directory", path, errno);
  Fd f(fd, path);
  if (::fsync(fd) != 0) raise_errno("cannot sync directory", path, errno);
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) raise_errno("cannot rename to '" + to + "'", from, errno);
}

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    for (const auto& name : list_dir(path)) remove_tree(path + "/" + name);
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT) raise_errno("cannot remove directory", path, errno);
  } else if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    raise_errno("cannot remove", path, errno);
  }
}

std::vector<std::string> list_dir(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) {
    if (errno == ENOENT || errno == ENOTDIR) return out;
    raise_errno("cannot list", path, errno);
  }
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<std::string> dirs_under(const std::string& path) {
  std::vector<std::string> out{path};
  for (std::size_t i = 0; i < out.size(); ++i) {
    for (const auto& name : list_dir(out[i])) {
      const std::string p = out[i] + "/" + name;
      struct stat st {};
      if (::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) out.push_back(p);
    }
  }
  return out;
}

}  // namespace shardkit::checkpoint::detail
