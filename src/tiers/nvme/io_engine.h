// Asynchronous positional file I/O behind one narrow interface, with two implementations in a
// fixed fallback order (STYLE rule 5): io_uring (registered file and buffers, a reaper thread),
// else a thread pool doing preadv/pwritev. The NVMe tier is written against this interface, so
// both run the same conformance suite, and a fault injector can sit in between.
#ifndef KVTIER_TIERS_NVME_IO_ENGINE_H_
#define KVTIER_TIERS_NVME_IO_ENGINE_H_

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvtier::internal {

struct IoRequest {
  bool write = false;
  int64_t offset = 0;        // bytes into the file; O_DIRECT: a multiple of 4096
  struct iovec buffer = {};  // one buffer; O_DIRECT: address and length multiples of 4096
  int registered_index = -1; // index of the registered buffer containing `buffer`, or -1
  // Runs exactly once, on an engine thread: the full length on success, else -errno. A short
  // transfer is resubmitted for the remainder; zero progress is -EIO.
  std::function<void(int64_t result)> done;
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  virtual const char* name() const = 0;
  // Queues every request of `batch`. Each request's `done` runs exactly once. If the engine
  // cannot submit the batch, every request of it fails (done gets a negative errno) only after
  // each one is known to have finished or been cancelled, so no buffer is released while the
  // kernel may still use it.
  virtual void Submit(std::vector<IoRequest> batch) = 0;
  // Test hook: the next submit to the kernel reports `-err` (after the kernel took the batch),
  // exercising the cancel-and-drain path of a failed submit. No-op for engines without a submit.
  virtual void InjectSubmitFailure(int err) { (void)err; }
  // Test hook: while held, completions from the kernel are not processed (no `done` runs), so a
  // test can observe that nothing is released before the kernel has answered.
  virtual void HoldCompletionsForTest(bool hold) { (void)hold; }
};

// io_uring on `fd` (registered as fixed file 0) with `queue_depth` entries and `buffers`
// registered (each at most 1 GiB). Errors: kUnavailable with the errno text when io_uring cannot
// be set up here (old kernel, seccomp, memlock limit): the caller falls back to the thread pool.
absl::StatusOr<std::unique_ptr<IoEngine>> CreateUringEngine(int fd, int queue_depth,
                                                            absl::Span<const struct iovec> buffers);

// `threads` threads doing preadv/pwritev on `fd`. Errors: kInvalidArgument for threads < 1.
absl::StatusOr<std::unique_ptr<IoEngine>> CreateThreadPoolEngine(int fd, int threads);

}  // namespace kvtier::internal

#endif  // KVTIER_TIERS_NVME_IO_ENGINE_H_
