// NvmeTier: local NVMe (or any file system) as a tier. One preallocated file, or a block device,
// opened with O_DIRECT; each slot is one 4 KiB header followed by the block, padded to 4 KiB
// (layout in docs/formats.md, "NVMe slot"). I/O goes through io_uring (the file and the staging
// buffers registered, `queue_depth` requests in flight), or, where io_uring cannot be set up, a
// thread pool doing pread/pwrite; both serve the same interface and pass the same conformance
// suite. Short transfers are resubmitted for the remainder; errno values become absl::Status
// (ENOSPC/EFBIG/EDQUOT -> kResourceExhausted; EINVAL, an alignment the device refuses ->
// kInternal; EIO and the rest -> kUnavailable).
//
// Every write carries the block key and an XXH3-64 checksum of the payload in its header, so a
// reopened tier finds its blocks again (warm restart: recovered() lists them and the allocator
// starts with them cached), and a torn or corrupt slot reads as kDataLoss, counted in
// corrupt_reads(), never as a block.
//
// Thread-safety: as TierBackend. Reads and writes never block the caller: a block that finds no
// staging buffer free waits in a first-come-first-served queue (shared by all callers) and
// starts when one frees, on the thread that completed the request holding it; one still queued
// at its deadline fails then with kDeadlineExceeded, fired by the tier's timer thread. So they
// may be called from any thread, completion callbacks of this tier included. Ownership: the tier
// owns its file descriptor; the file is kept on destruction (it is the cache).
#ifndef KVTIER_NVME_TIER_H_
#define KVTIER_NVME_TIER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/tier_backend.h"

namespace kvtier {

enum class NvmeEngine : uint8_t {
  kAuto = 0,        // io_uring, else the thread pool
  kIoUring = 1,     // io_uring or an error
  kThreadPool = 2,  // pread/pwrite on threads
};

struct NvmeTierOptions {
  std::string path;            // a file (created and preallocated if missing) or a block device
  int64_t capacity_bytes = 0;  // budget; capacity_blocks = floor(budget / slot_bytes)
  int queue_depth = 16;        // requests in flight, in [1, 4096]
  NvmeEngine engine = NvmeEngine::kAuto;
  int thread_pool_threads = 4;  // for kThreadPool or the fallback
};

class NvmeTier final : public TierBackend {
 public:
  static constexpr int64_t kHeaderBytes = 4096;
  static constexpr int64_t kAlignment = 4096;

  // Bytes one slot occupies in the file: the header plus the block, rounded up to 4 KiB.
  static int64_t SlotBytes(const KvGeometry& geometry);

  // Opens (or creates and preallocates) the file and scans every slot header.
  // Errors: kInvalidArgument for an empty path, a budget below one slot or above
  // BlockAllocator::kMaxCapacityBlocks slots (checked before the file is touched), a bad queue
  // depth or thread count; kResourceExhausted if the file system cannot preallocate the file
  // (ENOSPC, EFBIG); kUnavailable if the file cannot be opened with O_DIRECT, a block device is too
  // small, or kIoUring was asked for and io_uring cannot be set up here.
  static absl::StatusOr<std::unique_ptr<NvmeTier>> Create(const KvGeometry& geometry,
                                                          const NvmeTierOptions& options);
  // Waits for every operation in flight; those still queued for a staging buffer fail with
  // kUnavailable. Must not run inside a completion callback of this tier's own operations (it
  // joins the thread that runs them).
  ~NvmeTier() override;

  const TierInfo& info() const override;
  BlockAllocator& allocator() override;
  Completion WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                        const BlockIoOptions& options = {}) override;
  Completion ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                       const BlockIoOptions& options = {}) override;
  // The blocks of a batch that find a staging buffer free go to the device in one engine
  // submission; the rest queue (see the thread-safety note) and start one by one as buffers
  // free. If a submission fails, every block of it fails with that error, each only after the
  // kernel is known to be done with its buffer (case IO-2).
  std::vector<Completion> WriteBlocks(absl::Span<const BlockWrite> writes,
                                      const BlockIoOptions& options = {}) override;
  std::vector<Completion> ReadBlocks(absl::Span<const BlockRead> reads,
                                     const BlockIoOptions& options = {}) override;

  // "io_uring" or "thread_pool".
  const char* engine_name() const;
  // Blocks whose headers were valid when the tier was opened (their slots start kCached).
  const std::vector<RecoveredBlock>& recovered() const;
  std::vector<RecoveredBlock> recovered_blocks() const override { return recovered(); }
  // Reads that found a torn or corrupt slot (bad header, wrong length or checksum).
  int64_t corrupt_reads() const;
  // Staging buffers not in use by an operation; all of them when nothing is in flight.
  int free_staging_buffers() const;
  int staging_buffers() const;

  // Test hook: the next submit to io_uring reports failure with `err` (case IO-2).
  void InjectSubmitFailureForTest(int err);
  // Test hook: while held, io_uring completions are not processed: no Completion fires and no
  // staging buffer comes back (case IO-2).
  void HoldCompletionsForTest(bool hold);

 private:
  struct Impl;
  explicit NvmeTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_NVME_TIER_H_
