// FileIo over io_uring: a thread's batch of pieces goes to the kernel in one submission, so one
// reader thread keeps several reads in flight (pread keeps one).
#include <liburing.h>

#include <algorithm>
#include <cerrno>

#include "experts/expert_reader.h"

namespace strata::experts {

namespace {

class UringIo : public FileIo {
 public:
  explicit UringIo(io_uring ring, unsigned depth) : ring_(ring), depth_(depth) {}
  ~UringIo() override { io_uring_queue_exit(&ring_); }
  const char* name() const override { return "io_uring"; }

  void read(int fd, std::span<ReadOp> ops) override {
    for (size_t first = 0; first < ops.size(); first += depth_) {
      const size_t n = std::min<size_t>(depth_, ops.size() - first);
      run(fd, ops.subspan(first, n));
    }
  }

 private:
  void run(int fd, std::span<ReadOp> ops) {
    for (size_t i = 0; i < ops.size(); ++i) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      io_uring_prep_read(sqe, fd, ops[i].dst, unsigned(ops[i].length), ops[i].offset);
      io_uring_sqe_set_data64(sqe, i);
      ops[i].result = -EINPROGRESS;
    }
    size_t pending = ops.size();
    int submitted = io_uring_submit_and_wait(&ring_, unsigned(pending));
    while (submitted == -EINTR) submitted = io_uring_submit_and_wait(&ring_, unsigned(pending));
    if (submitted < 0) {
      // Nothing went to the kernel: the pieces fail (and are retried) like a failed pread.
      for (ReadOp& op : ops) op.result = submitted;
      io_uring_queue_exit(&ring_);
      io_uring_queue_init(depth_, &ring_, 0);
      return;
    }
    while (pending > 0) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
      if (rc < 0) {
        for (ReadOp& op : ops)
          if (op.result == -EINPROGRESS) op.result = rc;
        return;
      }
      ops[size_t(io_uring_cqe_get_data64(cqe))].result = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      --pending;
    }
  }

  io_uring ring_;
  unsigned depth_;
};

}  // namespace

std::unique_ptr<FileIo> make_uring_io(unsigned depth) {
  io_uring ring;
  if (io_uring_queue_init(depth, &ring, 0) < 0) return nullptr;
  return std::make_unique<UringIo>(ring, depth);
}

}  // namespace strata::experts
