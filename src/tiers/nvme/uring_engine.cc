// IoEngine on io_uring: one ring, the file registered as fixed file 0, the staging buffers
// registered for READ_FIXED/WRITE_FIXED, submissions under a mutex and one reaper thread.
//
// A failed submit (the enter syscall errors) is the dangerous case: some requests of the batch
// may already be in the kernel with our buffers. Every request of the batch is then marked
// failed, an ASYNC_CANCEL is queued for each, and each request completes only when its own CQE
// arrives (cancelled or finished), so its buffer is never released early (case IO-2).
#include <liburing.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "internal/mutex.h"
#include "tiers/nvme/io_engine.h"

namespace kvtier::internal {
namespace {

constexpr uint64_t kCancelTag = ~uint64_t{0};
constexpr uint64_t kWakeTag = ~uint64_t{0} - 1;

class UringEngine final : public IoEngine {
 public:
  UringEngine(int queue_depth)
      : queue_depth_(static_cast<size_t>(queue_depth)), ops_(queue_depth_) {
    for (size_t i = 0; i < ops_.size(); ++i) free_ops_.push_back(ops_.size() - 1 - i);
  }

  absl::Status Init(int fd, absl::Span<const struct iovec> buffers) {
    // Room for every request plus a cancel for each, so get_sqe never runs dry.
    const unsigned entries = static_cast<unsigned>(2 * queue_depth_ + 2);
    if (int r = io_uring_queue_init(entries, &ring_, 0); r < 0) {
      return absl::UnavailableError(absl::StrCat("io_uring_queue_init: ", std::strerror(-r)));
    }
    ring_ready_ = true;
    if (int r = io_uring_register_files(&ring_, &fd, 1); r < 0) {
      return absl::UnavailableError(absl::StrCat("io_uring_register_files: ", std::strerror(-r)));
    }
    if (!buffers.empty()) {
      if (int r = io_uring_register_buffers(&ring_, buffers.data(),
                                            static_cast<unsigned>(buffers.size()));
          r < 0) {
        return absl::UnavailableError(
            absl::StrCat("io_uring_register_buffers: ", std::strerror(-r)));
      }
    }
    reaper_ = std::thread([this] { Reap(); });
    return absl::OkStatus();
  }

  ~UringEngine() override {
    if (reaper_.joinable()) {
      {
        MutexLock lock(&mu_);
        while (free_ops_.size() < ops_.size()) space_cv_.Wait(&mu_);  // drain in-flight work
        io_uring_sqe* sqe = GetSqe();
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data64(sqe, kWakeTag);
        io_uring_submit(&ring_);
      }
      reaper_.join();
    }
    if (ring_ready_) io_uring_queue_exit(&ring_);
  }

  const char* name() const override { return "io_uring"; }

  void InjectSubmitFailure(int err) override {
    MutexLock lock(&mu_);
    inject_errno_ = err;
  }

  void HoldCompletionsForTest(bool hold) override {
    MutexLock lock(&mu_);
    hold_ = hold;
    hold_cv_.SignalAll();
  }

  void Submit(std::vector<IoRequest> batch) override {
    MutexLock lock(&mu_);
    std::vector<uint64_t> pending;
    for (IoRequest& r : batch) {
      while (free_ops_.empty()) {
        if (!pending.empty()) SubmitLocked(&pending);
        space_cv_.Wait(&mu_);
      }
      const uint64_t id = free_ops_.back();
      free_ops_.pop_back();
      ops_[id] = Op{std::move(r), 0, 0};
      Prep(id);
      pending.push_back(id);
    }
    if (!pending.empty()) SubmitLocked(&pending);
  }

 private:
  struct Op {
    IoRequest req;
    size_t done_bytes = 0;
    int failed_errno = 0;  // set when the batch's submit failed: finish with this error
  };

  // A submission entry; the ring has room for every op and a cancel for each, so running dry
  // means entries are waiting to be submitted: submit them and try again.
  io_uring_sqe* GetSqe() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (sqe == nullptr) {
      io_uring_submit(&ring_);
      std::this_thread::yield();
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }

  void Prep(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Op& op = ops_[id];
    char* buf = static_cast<char*>(op.req.buffer.iov_base) + op.done_bytes;
    const unsigned len = static_cast<unsigned>(op.req.buffer.iov_len - op.done_bytes);
    const int64_t offset = op.req.offset + static_cast<int64_t>(op.done_bytes);
    io_uring_sqe* sqe = GetSqe();
    if (op.req.registered_index >= 0) {
      if (op.req.write) {
        io_uring_prep_write_fixed(sqe, 0, buf, len, offset, op.req.registered_index);
      } else {
        io_uring_prep_read_fixed(sqe, 0, buf, len, offset, op.req.registered_index);
      }
    } else if (op.req.write) {
      io_uring_prep_write(sqe, 0, buf, len, offset);
    } else {
      io_uring_prep_read(sqe, 0, buf, len, offset);
    }
    sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, id);
  }

  void SubmitLocked(std::vector<uint64_t>* ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // io_uring_submit may take fewer entries than are queued; keep going until all are in.
    int r = io_uring_submit(&ring_);
    while (r >= 0 && io_uring_sq_ready(&ring_) > 0) {
      const int more = io_uring_submit(&ring_);
      if (more < 0) r = more;
      if (more == 0) std::this_thread::yield();
    }
    if (inject_errno_ != 0) {
      r = -inject_errno_;  // the kernel took the batch, but we are told the submit failed
      inject_errno_ = 0;
    }
    if (r < 0) {
      for (uint64_t id : *ids) {
        ops_[id].failed_errno = -r;
        io_uring_sqe* sqe = GetSqe();
        io_uring_prep_cancel64(sqe, id, 0);
        io_uring_sqe_set_data64(sqe, kCancelTag);
      }
      // The cancels (and any request the failed call left in the ring) go in now; each request
      // still finishes only when its own CQE arrives.
      for (int attempt = 0; attempt < 100 && io_uring_submit(&ring_) < 0; ++attempt) {
        std::this_thread::yield();
      }
    }
    ids->clear();
  }

  void Reap() {
    while (true) {
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe(&ring_, &cqe) < 0) continue;
      const uint64_t id = io_uring_cqe_get_data64(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (id == kCancelTag) continue;
      if (id == kWakeTag) return;
      {
        MutexLock lock(&mu_);
        while (hold_) hold_cv_.Wait(&mu_);
      }

      std::function<void(int64_t)> done;
      int64_t result = 0;
      {
        MutexLock lock(&mu_);
        Op& op = ops_[id];
        if (op.failed_errno != 0) {
          result = -op.failed_errno;
        } else if (res < 0) {
          result = res;
        } else if (res == 0) {
          result = -EIO;  // no progress: end of file or device
        } else {
          op.done_bytes += static_cast<size_t>(res);
          if (op.done_bytes < op.req.buffer.iov_len) {  // short: resubmit the remainder
            Prep(id);
            std::vector<uint64_t> again = {id};
            SubmitLocked(&again);
            continue;
          }
          result = static_cast<int64_t>(op.req.buffer.iov_len);
        }
        done = std::move(op.req.done);
        op = Op{};
        free_ops_.push_back(id);
        space_cv_.SignalAll();
      }
      done(result);
    }
  }

  io_uring ring_{};
  bool ring_ready_ = false;
  Mutex mu_;  // the submission queue, the op table and the free list
  CondVar space_cv_;
  const size_t queue_depth_;  // ops_.size(), fixed: readable without mu_
  std::vector<Op> ops_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> free_ops_ ABSL_GUARDED_BY(mu_);
  int inject_errno_ ABSL_GUARDED_BY(mu_) = 0;
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  CondVar hold_cv_;
  std::thread reaper_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoEngine>> CreateUringEngine(int fd, int queue_depth,
                                                            absl::Span<const struct iovec> buffers) {
  if (queue_depth < 1 || queue_depth > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("io_uring queue depth ", queue_depth,
                                                   " is outside [1, 4096]"));
  }
  auto engine = std::make_unique<UringEngine>(queue_depth);
  if (absl::Status s = engine->Init(fd, buffers); !s.ok()) return s;
  return std::unique_ptr<IoEngine>(std::move(engine));
}

}  // namespace kvtier::internal
