#include "route/binio.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace strata::route {

void ByteWriter::put_string(const std::string& s) {
  put(uint32_t(s.size()));
  bytes_.insert(bytes_.end(), s.begin(), s.end());
}

void ByteReader::need(size_t n, const char* field) const {
  if (remaining() < n)
    fail_at("truncated: ", field, " needs ", n, " bytes but only ", remaining(), " remain");
}

std::string ByteReader::get_string(const char* field, uint32_t max_len) {
  const auto len = get<uint32_t>(field);
  if (len > max_len) fail_at(field, " is ", len, " bytes long (at most ", max_len, ")");
  const auto raw = take(len, field);
  return std::string(raw.begin(), raw.end());
}

std::span<const uint8_t> ByteReader::take(size_t n, const char* field) {
  need(n, field);
  const auto out = bytes_.subspan(pos_, n);
  pos_ += n;
  return out;
}

uint64_t checksum(std::span<const uint8_t> bytes) { return XXH64(bytes.data(), bytes.size(), 0); }

void put_preamble(ByteWriter& w, std::string_view magic, uint32_t version) {
  for (char c : magic) w.put(c);
  w.put(version);
}

void expect_preamble(ByteReader& in, std::string_view magic, uint32_t version, const char* kind) {
  for (char c : magic)
    if (in.get<char>("magic") != c) fail(in.source(), ": not a strata ", kind, " (bad magic)");
  const auto v = in.get<uint32_t>("version");
  if (v != version) fail(in.source(), ": ", kind, " version ", v, " (this strata reads version ", version, ")");
}

std::pair<int, int> get_shape(ByteReader& in) {
  const auto n_layers = in.get<uint32_t>("n_layers");
  const auto n_experts = in.get<uint32_t>("n_experts");
  if (n_layers < 1 || n_layers > 4096 || n_experts < 1 || n_experts > 65535)
    in.fail_at("shape ", n_layers, " layers x ", n_experts, " experts is outside 1..4096 x 1..65535");
  return {int(n_layers), int(n_experts)};
}

void expect_final_checksum(ByteReader& in, std::span<const uint8_t> all) {
  const size_t body_end = in.offset();
  if (in.get<uint64_t>("checksum") != checksum(all.first(body_end)))
    fail(in.source(), ": checksum mismatch (the file is corrupt)");
  if (in.remaining() != 0) in.fail_at(in.remaining(), " unexpected bytes after the checksum");
}

void save_with_checksum(ByteWriter& w, const std::string& path, const char* kind) {
  w.put(checksum(w.bytes()));
  write_file_atomic(path, w.bytes(), kind);
}

std::vector<uint8_t> read_whole_file(const std::string& path, const char* kind) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(kind, " ", path, ": cannot open: ", std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(kind, " ", path, ": read failed");
  return bytes;
}

void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes, const char* kind) {
  const std::string tmp = cat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(kind, " ", path, ": cannot create ", tmp, ": ", std::strerror(errno));
  auto give_up = [&](const char* step) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(kind, " ", path, ": ", step, " ", tmp, " failed: ", std::strerror(err));
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = EIO;  // a regular file that takes no bytes and says nothing
    if (n <= 0) give_up("writing");
    done += size_t(n);
  }
  if (::fsync(fd) != 0) give_up("syncing");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(kind, " ", path, ": closing ", tmp, " failed: ", std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(kind, " ", path, ": renaming ", tmp, " over it failed: ", std::strerror(err));
  }
  // The rename is durable once the directory is synced; the file is whole either way. A
  // directory that cannot be opened or synced (some filesystems refuse) loses nothing but that.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dir_fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace strata::route
