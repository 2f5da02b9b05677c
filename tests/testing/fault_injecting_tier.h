// A TierBackend wrapper that injects faults: failed reads or writes with a chosen status, and a
// delay before each operation reaches the wrapped tier (a slow device). STYLE rule 3: every
// platform service has a fault injector beside it, and the conformance suite uses it.
#ifndef KVTIER_TESTS_TESTING_FAULT_INJECTING_TIER_H_
#define KVTIER_TESTS_TESTING_FAULT_INJECTING_TIER_H_

#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "internal/mutex.h"
#include "internal/stream_worker.h"
#include "kvtier/tier_backend.h"

namespace kvtier::testing {

class FaultInjectingTier final : public TierBackend {
 public:
  explicit FaultInjectingTier(std::unique_ptr<TierBackend> inner) : inner_(std::move(inner)) {}
  ~FaultInjectingTier() override { worker_.reset(); }  // finish delayed work before inner_ goes

  // The next `n` writes (reads) complete with `status` without reaching the wrapped tier.
  void FailNextWrites(int n, absl::Status status) {
    internal::MutexLock lock(&mu_);
    fail_writes_ = n;
    write_status_ = std::move(status);
  }
  void FailNextReads(int n, absl::Status status) {
    internal::MutexLock lock(&mu_);
    fail_reads_ = n;
    read_status_ = std::move(status);
  }
  // Every later operation waits `delay` (on a worker thread, in order) before it is forwarded.
  void SetDelay(absl::Duration delay) {
    internal::MutexLock lock(&mu_);
    delay_ = delay;
  }

  const TierInfo& info() const override { return inner_->info(); }
  BlockAllocator& allocator() override { return inner_->allocator(); }
  std::byte* HostAddress(SlotId slot) override { return inner_->HostAddress(slot); }
  void BeginHostWrite(SlotId slot) override { inner_->BeginHostWrite(slot); }
  void EndHostWrite(SlotId slot, const BlockKey& key) override { inner_->EndHostWrite(slot, key); }
  absl::Status CheckHolds(SlotId slot, const BlockKey& key) override {
    return inner_->CheckHolds(slot, key);
  }
  // Device tiers stay device tiers when wrapped: the kernel still writes the inner pool in place.
  void BeginDeviceWrite(SlotId slot) override { inner_->BeginDeviceWrite(slot); }
  void EndDeviceWrite(SlotId slot, const BlockKey& key) override {
    inner_->EndDeviceWrite(slot, key);
  }
  std::optional<DevicePoolView> device_pool() const override { return inner_->device_pool(); }
  absl::StatusOr<Completion> CompletionOfDeviceEvent(void* cuda_event) override {
    return inner_->CompletionOfDeviceEvent(cuda_event);
  }
  std::vector<RecoveredBlock> recovered_blocks() const override {
    return inner_->recovered_blocks();
  }
  void DiscardBlock(SlotId slot, const BlockKey& key) override { inner_->DiscardBlock(slot, key); }
  // Discovery reaches the wrapped tier's store unchanged (no fault is injected into probes).
  absl::StatusOr<std::vector<bool>> ProbeBlocks(absl::Span<const BlockKey> keys,
                                                absl::Time deadline) override {
    return inner_->ProbeBlocks(keys, deadline);
  }
  absl::Status AdoptStoredBlock(SlotId slot, const BlockKey& key) override {
    return inner_->AdoptStoredBlock(slot, key);
  }

  Completion WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                        const BlockIoOptions& options = {}) override {
    if (absl::Status s = TakeFault(&fail_writes_, &write_status_); !s.ok()) {
      return Completion::Done(std::move(s));
    }
    return Forward([=, this] { return inner_->WriteBlock(slot, key, src, options); });
  }
  Completion ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                       const BlockIoOptions& options = {}) override {
    if (absl::Status s = TakeFault(&fail_reads_, &read_status_); !s.ok()) {
      return Completion::Done(std::move(s));
    }
    return Forward([=, this] { return inner_->ReadBlock(slot, key, dst, options); });
  }
  // Records the batch's size (write_batches()). It reaches the wrapped tier whole (a layer-wise
  // tier writes it layer-major) unless a fault or a delay is set; then block by block as above.
  std::vector<Completion> WriteBlocks(absl::Span<const BlockWrite> writes,
                                      const BlockIoOptions& options = {}) override {
    {
      internal::MutexLock lock(&mu_);
      write_batches_.push_back(writes.size());
      if (fail_writes_ <= 0 && delay_ == absl::ZeroDuration()) {
        return inner_->WriteBlocks(writes, options);
      }
    }
    return TierBackend::WriteBlocks(writes, options);
  }
  // Records the batch's size (read_batches()), then reads block by block as above.
  std::vector<Completion> ReadBlocks(absl::Span<const BlockRead> reads,
                                     const BlockIoOptions& options = {}) override {
    {
      internal::MutexLock lock(&mu_);
      read_batches_.push_back(reads.size());
    }
    return TierBackend::ReadBlocks(reads, options);
  }
  // The size of every ReadBlocks call so far, in order (single ReadBlock calls not included).
  std::vector<size_t> read_batches() const {
    internal::MutexLock lock(&mu_);
    return read_batches_;
  }
  // The size of every WriteBlocks call so far, in order (single WriteBlock calls not included).
  std::vector<size_t> write_batches() const {
    internal::MutexLock lock(&mu_);
    return write_batches_;
  }

 private:
  absl::Status TakeFault(int* remaining, absl::Status* status) {
    internal::MutexLock lock(&mu_);
    if (*remaining <= 0) return absl::OkStatus();
    --*remaining;
    return *status;
  }

  template <typename Op>
  Completion Forward(Op op) {
    absl::Duration delay;
    {
      internal::MutexLock lock(&mu_);
      delay = delay_;
    }
    if (delay == absl::ZeroDuration()) return op();
    Completion outer;
    worker_->Enqueue([delay, op, outer] {
      absl::SleepFor(delay);
      op().OnDone([outer](const absl::Status& s) { outer.Complete(s); });
    });
    return outer;
  }

  std::unique_ptr<TierBackend> inner_;
  mutable internal::Mutex mu_;
  std::vector<size_t> read_batches_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> write_batches_ ABSL_GUARDED_BY(mu_);
  int fail_writes_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_reads_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status write_status_ ABSL_GUARDED_BY(mu_);
  absl::Status read_status_ ABSL_GUARDED_BY(mu_);
  absl::Duration delay_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  std::unique_ptr<internal::StreamWorker> worker_ = std::make_unique<internal::StreamWorker>();
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_FAULT_INJECTING_TIER_H_
