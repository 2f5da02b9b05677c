// DirectoryTransport: a Transport over a directory on a shared mount (NFS, 3FS, Lustre style):
// one file per key. A value is written to a temporary name in the same directory and renamed
// into place, so a reader sees either the old or the new value whole, never half of one, even
// with several processes writing the same key at once (rename is atomic within a file system).
// Calls run on the calling thread and complete before they return; the deadline is checked before
// each item starts, so a hung mount can block past it. Values are files of mode 0600 and a root
// it creates is 0700: frames are not encrypted, and KV reveals the prompts it came from. A read
// takes only a regular file (no symlink, FIFO or device) of at most TransportGet::max_bytes.
//
// Thread-safety: thread-safe, and safe across processes sharing the directory.
#ifndef KVTIER_DIRECTORY_TRANSPORT_H_
#define KVTIER_DIRECTORY_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
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
  // thread sweeps: it lists the root and deletes the least recently used values (oldest
  // modification time; a read refreshes it) until they fill at most sweep_to_fraction of the
  // bound. Every process sharing the root may sweep; the count is re-read from the directory at
  // each sweep, so values other processes wrote are counted then. A swept value is a miss for its
  // readers, never an error.
  int64_t max_bytes = 0;
  double sweep_to_fraction = 0.9;  // in (0, 1]
};

class DirectoryTransport final : public Transport {
 public:
  // Errors: kInvalidArgument for an empty root, a negative max_bytes or sweep_to_fraction
  // outside (0, 1]; kUnavailable if it cannot be created or used. Also sweeps stale temporary
  // files (options.stale_temporary_age) and counts the values already there (max_bytes).
  static absl::StatusOr<std::unique_ptr<DirectoryTransport>> Create(
      const DirectoryTransportOptions& options);

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
  // Counts `bytes` more in the root; sweeps if that passes max_bytes.
  void Account(int64_t bytes);
  // Lists the root, recounts it, and deletes the oldest values down to the sweep target.
  void Sweep();
  DirectoryTransport(const DirectoryTransportOptions& options, uint64_t nonce)
      : options_(options), nonce_(nonce) {}
  DirectoryTransportOptions options_;
  uint64_t nonce_;  // random per transport: temporary names never collide across hosts
  std::atomic<uint64_t> next_tmp_{0};
  std::atomic<int64_t> counted_bytes_{0};  // values in the root, as this transport knows them
  std::atomic<bool> sweeping_{false};      // one sweep at a time per transport
  std::atomic<int64_t> swept_values_{0};
  std::atomic<int64_t> swept_bytes_{0};
};

}  // namespace kvtier

#endif  // KVTIER_DIRECTORY_TRANSPORT_H_
