// DirectoryTransport: a Transport over a directory on a shared mount (NFS, 3FS, Lustre style):
// one file per key. A value is written to a temporary name in the same directory and renamed
// into place, so a reader sees either the old or the new value whole, never half of one, even
// with several processes writing the same key at once (rename is atomic within a file system).
// Each item runs on a worker thread (a call returns once it has copied its Put values), and
// completes by the call's deadline (kDeadlineExceeded) even when the mount hangs: the system call
// goes on in its worker, and its outcome is dropped. So a Put's value is copied at the call (the
// caller's buffer is free once the item completes), a Get's value reaches the caller's buffers
// only before its item completes, and an item whose deadline passes while it waits for a worker
// is never started; a Put or Delete already running when its deadline passes may still land
// after. Exists and Delete (one system call each) have a thread of their own besides, so a probe
// never waits behind values being written. Past 4096 items or max_queued_bytes of copied values
// waiting for a worker (every worker stuck in a mount that does not answer), a call's items fail
// at once with kUnavailable; a value larger than that bound is still taken when no other value
// waits.
// Values are files of mode 0600 and a root it creates is 0700: frames are not encrypted, and KV
// reveals the prompts it came from. A read takes only a regular file (no symlink, FIFO or device)
// of at most TransportGet::max_bytes.
//
// Thread-safety: thread-safe, and safe across processes sharing the directory.
#ifndef KVTIER_DIRECTORY_TRANSPORT_H_
#define KVTIER_DIRECTORY_TRANSPORT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtier/completion.h"
#include "kvtier/transport.h"

namespace kvtier {

enum class FsyncPolicy : uint8_t {
  kNone = 0,              // rely on the file system (fast; a crash may lose recent values)
  kFile = 1,              // fsync each value before the rename
  kFileAndDirectory = 2,  // and fsync the directory after it, so the name survives a crash
};

struct DirectoryTransportOptions {
  std::string root;  // created if missing
  FsyncPolicy fsync = FsyncPolicy::kNone;
  // Create removes temporary files older than this, left by writers that crashed before the
  // rename (any process sharing the root may have left them); zero keeps them.
  absl::Duration stale_temporary_age = absl::Hours(1);
  // A bound on the bytes of values in the root (0: none), so a shared directory does not grow
  // without end. When a Put takes the values this transport has counted past it, the Put's
  // worker sweeps, after answering the Put: it lists the root and deletes the least recently
  // used values (oldest
  // modification time; a read refreshes it) until they fill at most sweep_to_fraction of the
  // bound. Every process sharing the root may sweep; the count is re-read from the directory at
  // each sweep, so values other processes wrote are counted then. A swept value is a miss for its
  // readers, never an error.
  int64_t max_bytes = 0;
  double sweep_to_fraction = 0.9;  // in (0, 1]
  // Worker threads reading and writing values, 1..64 (plus one for Exists and Delete): as many
  // values move at once, and as many hung calls stop the transport.
  int io_threads = 4;
  // Bytes of copied Put values that may wait for a worker, > 0; past them a Put fails at once
  // (kUnavailable) unless no other value waits (one value of any size is taken then).
  int64_t max_queued_bytes = int64_t{1} << 30;
};

class DirectoryTransport final : public Transport {
 public:
  // Errors: kInvalidArgument for an empty root, a negative max_bytes, sweep_to_fraction
  // outside (0, 1], io_threads outside 1..64 or max_queued_bytes <= 0; kUnavailable if it cannot be
  // created or used. Also sweeps stale temporary files (options.stale_temporary_age) and counts the
  // values already there (max_bytes), on the calling thread.
  static absl::StatusOr<std::unique_ptr<DirectoryTransport>> Create(
      const DirectoryTransportOptions& options);
  // Fails the items still waiting for a worker (kCancelled) and waits for those running.
  ~DirectoryTransport() override;

  std::string name() const override;
  // Keys may use letters, digits and . _ : -, up to 200 bytes, and are the file names; anything
  // else is kInvalidArgument (no key can name a path outside the root). A read of something that
  // is not a regular file within the size limit is kDataLoss (a symbolic link included; it is not
  // followed). Exists finds only regular files, and Put, if_absent or not, replaces a link,
  // FIFO or other non-directory at its key (the link itself, never what it points at); a
  // directory there stays, and a Put of that key fails with kDataLoss.
  std::vector<Completion> Put(absl::Span<const TransportPut> items, absl::Time deadline) override;
  std::vector<Completion> Get(absl::Span<const TransportGet> items, absl::Time deadline) override;
  std::vector<Completion> Exists(absl::Span<const std::string> keys, absl::Time deadline) override;
  std::vector<Completion> Delete(absl::Span<const std::string> keys, absl::Time deadline) override;

  // Values deleted by sweeps (max_bytes) and their bytes, since Create.
  int64_t swept_values() const { return swept_values_.load(); }
  int64_t swept_bytes() const { return swept_bytes_.load(); }

 private:
  struct Answer;
  struct Pool;
  // Queues `work` (with `bytes` of copied value) in a lane; the item also completes
  // kDeadlineExceeded at `deadline`.
  Completion Submit(absl::Time deadline, bool names_lane, int64_t bytes,
                    std::function<void(Answer& answer)> work);
  // Claims the item for its worker (false if its deadline answered it first) and stops its
  // timer; the claimer then completes it.
  bool Take(Answer& answer);
  // Completes the item with `status` unless its deadline did first.
  void Finish(Answer& answer, absl::Status status);
  void RunWorker(bool names_only);
  // The file I/O of one item, on a worker.
  absl::Status PutValue(const std::string& name, absl::Span<const std::byte> value, bool if_absent);
  absl::Status ReadValue(const std::string& name, int64_t max_bytes, std::vector<std::byte>* out);
  // Exists and Delete: `op(path)` per key on a worker; false with errno set is a failure.
  std::vector<Completion> ForEachKey(absl::Span<const std::string> keys, absl::Time deadline,
                                     bool (*op)(const std::string& path));
  // Counts `bytes` more in the root; sweeps if that passes max_bytes.
  void Account(int64_t bytes);
  // Lists the root, recounts it, and deletes the oldest values down to the sweep target.
  void Sweep();
  DirectoryTransport(const DirectoryTransportOptions& options, uint64_t nonce);
  DirectoryTransportOptions options_;
  uint64_t nonce_;  // random per transport: temporary names never collide across hosts
  std::atomic<uint64_t> next_tmp_{0};
  std::atomic<int64_t> counted_bytes_{0};  // values in the root, as this transport knows them
  std::atomic<bool> sweeping_{false};      // one sweep at a time per transport
  std::atomic<int64_t> swept_values_{0};
  std::atomic<int64_t> swept_bytes_{0};
  std::unique_ptr<Pool> pool_;  // its workers use every member above; joined by the destructor
};

}  // namespace kvtier

#endif  // KVTIER_DIRECTORY_TRANSPORT_H_
