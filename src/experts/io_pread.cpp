// FileIo's default: one pread(2) per op, in the calling thread.
#include <unistd.h>

#include <cerrno>

#include "experts/expert_reader.h"

namespace strata::experts {

namespace {

class PreadIo : public FileIo {
 public:
  const char* name() const override { return "pread"; }
};

}  // namespace

void FileIo::read(int fd, std::span<ReadOp> ops) {
  for (ReadOp& op : ops) op.result = pread(fd, op.dst, op.length, op.offset);
}

ssize_t FileIo::pread(int fd, void* dst, size_t length, uint64_t offset) {
  for (;;) {
    const ssize_t got = ::pread(fd, dst, length, off_t(offset));
    if (got >= 0) return got;
    if (errno != EINTR) return -errno;
  }
}

std::unique_ptr<FileIo> make_pread_io() { return std::make_unique<PreadIo>(); }

}  // namespace strata::experts
