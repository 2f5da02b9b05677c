// TransferEngine (transfer_engine.h): copies between tiers, their ordering, slots, deadlines.
#include "kvtier/transfer_engine.h"

#include <algorithm>
#include <cassert>
#include <deque>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/deadline_timer.h"
#include "internal/host_region.h"
#include "internal/mutex.h"
#include "internal/status_macros.h"
#include "internal/stream_worker.h"
#include "internal/strings.h"

namespace kvtier {
namespace {

using internal::ToAbsl;

// The engine drives every slot transition itself, so each one must succeed; a failure is a bug in
// the engine's own bookkeeping (caught by the debug builds the asan preset makes).
void Expect(const absl::Status& transition) {
  assert(transition.ok());
  (void)transition;
}

bool Present(const std::array<TierBackend*, kNumTiers>& tiers, Tier t) {
  return TierIndex(t) >= 0 && TierIndex(t) < kNumTiers && tiers[TierIndex(t)] != nullptr;
}

uint64_t SlotKey(Tier tier, SlotId slot) {
  return (static_cast<uint64_t>(TierIndex(tier)) << 32) | slot.value();
}

}  // namespace

struct TransferEngine::Impl : std::enable_shared_from_this<TransferEngine::Impl> {
  struct Op {
    uint64_t id = 0;
    BlockKey key;
    Tier from = Tier::kHbm, to = Tier::kHbm;
    SlotId src, dst;
    TransferOptions options;
    Completion user;
    bool running = false;
    bool timed_out = false;
    bool src_pinned = false;
    int bounce = -1;
    uint64_t timer_id = 0;
    absl::Time started;
  };

  std::array<TierBackend*, kNumTiers> tiers{};
  int64_t block_bytes = 0;
  internal::HostRegion bounce_region;

  mutable internal::Mutex mu;
  internal::CondVar idle_cv;
  std::vector<int> free_bounce ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Op>> ops ABSL_GUARDED_BY(mu);
  // Ended transfers whose Completion is still being fired (outside mu): the destructor waits
  // for them as for `ops`, so no callback of the owner's runs after it returns.
  int64_t delivering ABSL_GUARDED_BY(mu) = 0;
  std::deque<uint64_t> waiting ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uint64_t, uint64_t> pending_dst ABSL_GUARDED_BY(mu);  // SlotKey -> op
  std::array<std::array<TransferStats, kNumTiers>, kNumTiers> stats ABSL_GUARDED_BY(mu);
  uint64_t next_id ABSL_GUARDED_BY(mu) = 1;

  // Stopped by Shutdown() on the destroying thread, never by the last reference: a callback that
  // outlives the engine may drop that reference on one of these very threads.
  std::unique_ptr<internal::DeadlineTimer> timer ABSL_GUARDED_BY(mu) =
      std::make_unique<internal::DeadlineTimer>();
  internal::Mutex dispatch_mu;
  // Starts copies; may block in a backend, never under `mu`.
  std::unique_ptr<internal::StreamWorker> dispatcher ABSL_GUARDED_BY(dispatch_mu) =
      std::make_unique<internal::StreamWorker>();

  void Dispatch(std::function<void()> task) {
    internal::MutexLock lock(&dispatch_mu);
    if (dispatcher != nullptr) dispatcher->Enqueue(std::move(task));
  }

  // Joins the timer and dispatcher threads; later callbacks find them gone and do nothing.
  void Shutdown() {
    std::unique_ptr<internal::DeadlineTimer> t;
    {
      internal::MutexLock lock(&mu);
      t = std::move(timer);
    }
    t.reset();
    std::unique_ptr<internal::StreamWorker> d;
    {
      internal::MutexLock lock(&dispatch_mu);
      d = std::move(dispatcher);
    }
    d.reset();
  }

  explicit Impl(internal::HostRegion region) : bounce_region(std::move(region)) {}

  BlockAllocator& Alloc(Tier t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return tiers[TierIndex(t)]->allocator();
  }
  bool NeedsBounce(const Op& op) const {
    return (tiers[TierIndex(op.from)]->info().capabilities & kCapHostAddressable) == 0 &&
           (tiers[TierIndex(op.to)]->info().capabilities & kCapHostAddressable) == 0;
  }
  // Both ends finish their I/O on the calling thread (kCapInlineIo): the copy can run inside
  // Copy, with no hand-off to the dispatcher.
  bool Inline(const Op& op) const {
    return (tiers[TierIndex(op.from)]->info().capabilities & kCapInlineIo) != 0 &&
           (tiers[TierIndex(op.to)]->info().capabilities & kCapInlineIo) != 0;
  }
  absl::Span<std::byte> Bounce(int index) const {
    return {bounce_region.data() + static_cast<int64_t>(index) * block_bytes,
            static_cast<size_t>(block_bytes)};
  }

  void SchedulePump() {
    std::weak_ptr<Impl> weak = weak_from_this();
    Dispatch([weak] {
      if (auto self = weak.lock()) self->Pump();
    });
  }

  // Ends `op`: unpins the source, frees its bounce buffer, settles the destination slot, counts
  // it. Returns the status to fire on the caller's Completion, or nullopt if it already fired.
  std::optional<absl::Status> FinishLocked(Op& op, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    // At most once per transfer: a deadline and a failure found by Pump (or the destructor) can
    // both try to end the same transfer, and a second pass would free a slot that by then
    // belongs to another transfer.
    if (!ops.contains(op.id)) return std::nullopt;
    if (op.src_pinned) Expect(Alloc(op.from).Release(op.src));
    if (op.bounce >= 0) free_bounce.push_back(op.bounce);
    if (op.timer_id != 0 && timer != nullptr) timer->Cancel(op.options.deadline, op.timer_id);
    TransferStats& st = stats[TierIndex(op.from)][TierIndex(op.to)];
    std::optional<absl::Status> fire;
    if (op.timed_out) {
      // Known complete or dead only now: the quarantined destination can be reused.
      Expect(Alloc(op.to).ReclaimQuarantined(op.dst));
    } else if (status.ok()) {
      Expect(Alloc(op.to).CompleteTransfer(op.dst));
      if (op.options.pin_destination) Expect(Alloc(op.to).Acquire(op.dst));
      st.bytes += block_bytes;
      st.blocks += 1;
      const double seconds = absl::ToDoubleSeconds(absl::Now() - op.started);
      if (seconds > 0) {
        const double bw = static_cast<double>(block_bytes) / seconds;
        st.bandwidth_bytes_per_second = st.bandwidth_bytes_per_second == 0
                                             ? bw
                                             : st.bandwidth_bytes_per_second * 7 / 8 + bw / 8;
      }
      fire = absl::OkStatus();
    } else {
      Expect(Alloc(op.to).CancelTransfer(op.dst));  // the backend is done: nothing more lands
      st.failures += 1;
      fire = std::move(status);
    }
    // A copy chained on the destination waits until this one's Completion has fired (Deliver
    // lets it go then); with none to fire, it may go now.
    if (!fire.has_value()) pending_dst.erase(SlotKey(op.to, op.dst));
    ops.erase(op.id);
    if (ops.empty()) idle_cv.SignalAll();
    return fire;
  }

  void Finish(const std::shared_ptr<Op>& op, absl::Status status) {
    std::optional<absl::Status> fire;
    bool waiters = false;
    {
      internal::MutexLock lock(&mu);
      fire = FinishLocked(*op, std::move(status));
      waiters = !waiting.empty();
      if (fire.has_value()) ++delivering;
    }
    if (fire.has_value()) return Deliver(*op, *std::move(fire));
    if (waiters) SchedulePump();  // a waiter may have wanted this slot or bounce buffer
  }

  // Fires `op`'s Completion (its callbacks run here); then, if `op` has ended, lets copies
  // chained on its destination start (so none finishes before this Completion has fired: the
  // test ChainedCopyWaitsForItsArrivingSource saw that, now and then, under load) and pumps
  // the waiters; then lets the destructor go on.
  void Deliver(Op& op, absl::Status status) ABSL_LOCKS_EXCLUDED(mu) {
    op.user.Complete(std::move(status));
    bool waiters = false;
    {
      internal::MutexLock lock(&mu);
      if (!ops.contains(op.id)) {
        const auto it = pending_dst.find(SlotKey(op.to, op.dst));
        if (it != pending_dst.end() && it->second == op.id) pending_dst.erase(it);
      }
      waiters = !waiting.empty();
    }
    if (waiters) SchedulePump();
    internal::MutexLock lock(&mu);
    if (--delivering == 0 && ops.empty()) idle_cv.SignalAll();
  }

  void OnDeadline(uint64_t id) {
    std::shared_ptr<Op> op;
    std::optional<absl::Status> fire;
    {
      internal::MutexLock lock(&mu);
      auto it = ops.find(id);
      if (it == ops.end()) return;
      op = it->second;
      op->timer_id = 0;
      const absl::Status late = absl::DeadlineExceededError(absl::StrCat(
          "transfer of block ", op->key.ToHex(), " from ", ToAbsl(TierName(op->from)), " to ",
          ToAbsl(TierName(op->to)), " passed its deadline"));
      if (!op->running) {
        std::erase(waiting, id);
        fire = FinishLocked(*op, late);  // never started: the destination is simply freed
      } else if (op->options.deadline_bounds_start) {
        return;  // its backends have the deadline: Finish fires once they are done
      } else {
        // It may still land: quarantine the destination until the backend says it is done.
        op->timed_out = true;
        Expect(Alloc(op->to).FailTransfer(op->dst));
        stats[TierIndex(op->from)][TierIndex(op->to)].failures += 1;
        fire = late;
      }
      if (fire.has_value()) ++delivering;
    }
    if (fire.has_value()) return Deliver(*op, *std::move(fire));
    SchedulePump();
  }

  // Starts every waiting transfer whose conditions hold, in arrival order.
  void Pump() {
    std::vector<std::shared_ptr<Op>> start;
    std::vector<std::pair<std::shared_ptr<Op>, absl::Status>> fail;
    {
      internal::MutexLock lock(&mu);
      for (auto it = waiting.begin(); it != waiting.end();) {
        std::shared_ptr<Op> op = ops[*it];
        if (op->options.source_ready.has_value()) {
          if (!op->options.source_ready->done()) {
            ++it;
            continue;
          }
          if (absl::Status s = op->options.source_ready->status(); !s.ok()) {
            fail.emplace_back(op, absl::Status(s.code(), absl::StrCat("source not ready: ",
                                                                       s.message())));
            it = waiting.erase(it);
            continue;
          }
        }
        absl::StatusOr<bool> started = TryStartLocked(*op);
        if (!started.ok()) {
          fail.emplace_back(op, started.status());
          it = waiting.erase(it);
          continue;
        }
        if (!*started) {
          ++it;
          continue;
        }
        start.push_back(op);
        it = waiting.erase(it);
      }
    }
    for (auto& [op, status] : fail) Finish(op, std::move(status));
    StartIo(start);
  }

  // Starts `op` if its source has landed and a bounce buffer is free where one is needed (the
  // caller has checked source_ready): pins the source, takes the buffer, marks it running.
  // False if it must wait; an error if the source cannot be pinned (the caller finishes it).
  absl::StatusOr<bool> TryStartLocked(Op& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (pending_dst.contains(SlotKey(op.from, op.src))) return false;  // the source is arriving
    const bool bounce = NeedsBounce(op);
    if (bounce && free_bounce.empty()) return false;
    KVTIER_RETURN_IF_ERROR(Alloc(op.from).Acquire(op.src));
    op.src_pinned = true;
    if (bounce) {
      op.bounce = free_bounce.back();
      free_bounce.pop_back();
    }
    op.running = true;
    op.started = absl::Now();
    return true;
  }

  // How a copy whose source is not host-addressable starts: a read of the source into `read.dst`
  // (the destination's own bytes, or a bounce buffer), then `then` with the read's status.
  struct SourceRead {
    BlockRead read;
    std::function<void(const absl::Status&)> then;
  };

  // Fills `out` for a copy that starts with a read of its source (the source is not
  // host-addressable); false for one that starts with a write of the destination from the
  // source's bytes in place.
  bool PlanSourceRead(const std::shared_ptr<Op>& op, SourceRead& out) {
    TierBackend* src = tiers[TierIndex(op->from)];
    TierBackend* dst = tiers[TierIndex(op->to)];
    if (src->info().capabilities & kCapHostAddressable) return false;
    std::weak_ptr<Impl> weak = weak_from_this();
    auto done = [weak, op](const absl::Status& s) {
      if (auto self = weak.lock()) self->Finish(op, s);
    };
    const BlockIoOptions io{.deadline = op->options.deadline, .layers = op->options.layers};
    if (dst->info().capabilities & kCapHostAddressable) {
      dst->BeginHostWrite(op->dst);
      out.read = {op->src, op->key, {dst->HostAddress(op->dst), static_cast<size_t>(block_bytes)}};
      out.then = [dst, op, done](const absl::Status& s) {
        if (s.ok()) dst->EndHostWrite(op->dst, op->key);
        done(s);
      };
      return true;
    }
    // Staged: read into a bounce buffer, then (from the dispatcher, which may block in a
    // backend) write it out.
    const absl::Span<std::byte> bounce = Bounce(op->bounce);
    const bool inline_io = Inline(*op);
    out.read = {op->src, op->key, bounce};
    out.then = [weak, dst, op, bounce, io, done, inline_io](const absl::Status& s) {
      auto self = weak.lock();
      if (!self) return;
      if (!s.ok()) return self->Finish(op, s);
      if (inline_io) return dst->WriteBlock(op->dst, op->key, bounce, io).OnDone(done);
      self->Dispatch([dst, op, bounce, io, done] {
        dst->WriteBlock(op->dst, op->key, bounce, io).OnDone(done);
      });
    };
    return true;
  }

  // Starts the data movement of `op` (running, source pinned).
  void StartIo(const std::shared_ptr<Op>& op) {
    SourceRead plan;
    if (PlanSourceRead(op, plan)) {
      tiers[TierIndex(op->from)]
          ->ReadBlock(plan.read.slot, plan.read.key, plan.read.dst,
                      {.deadline = op->options.deadline})
          .OnDone(std::move(plan.then));
      return;
    }
    TierBackend* src = tiers[TierIndex(op->from)];
    TierBackend* dst = tiers[TierIndex(op->to)];
    if (absl::Status s = src->CheckHolds(op->src, op->key); !s.ok()) return Finish(op, s);
    std::weak_ptr<Impl> weak = weak_from_this();
    // A backend that would have to wait (a store, NVMe staging buffers) gives up at the
    // caller's deadline.
    dst->WriteBlock(op->dst, op->key, {src->HostAddress(op->src), static_cast<size_t>(block_bytes)},
                    {.deadline = op->options.deadline, .layers = op->options.layers})
        .OnDone([weak, op](const absl::Status& s) {
          if (auto self = weak.lock()) self->Finish(op, s);
        });
  }

  // Starts copies that began in one pass: the source reads of one tier and batch
  // (TransferOptions::batch: one request's) go to that tier as one ReadBlocks (one transport
  // batch for a remote tier, one submission for NVMe), bounded by the latest deadline among them
  // (one request's copies have nearly the same one; a caller keeping its own deadline,
  // deadline_bounds_start, is not held by it); the others start one by one.
  void StartIo(const std::vector<std::shared_ptr<Op>>& started) {
    struct Group {
      Tier from;
      uint64_t batch;
      absl::Time deadline;
      std::vector<BlockRead> reads;
      std::vector<std::function<void(const absl::Status&)>> then;
    };
    std::vector<Group> groups;
    // Writes from a host-addressable source into a kCapLayerwise destination that asked for
    // layer progress: one WriteBlocks per destination tier and batch, so a request's blocks land
    // layer-major together, under their own deadline.
    struct LayeredGroup {
      Tier to;
      uint64_t batch;
      absl::Time deadline;
      std::vector<BlockWrite> writes;
      std::vector<std::shared_ptr<Op>> ops;
    };
    std::vector<LayeredGroup> layered;
    for (const std::shared_ptr<Op>& op : started) {
      SourceRead plan;
      if (!PlanSourceRead(op, plan)) {
        TierBackend* dst = tiers[TierIndex(op->to)];
        if (op->options.layers == nullptr || (dst->info().capabilities & kCapLayerwise) == 0) {
          StartIo(op);
          continue;
        }
        TierBackend* src = tiers[TierIndex(op->from)];
        if (absl::Status s = src->CheckHolds(op->src, op->key); !s.ok()) {
          Finish(op, s);
          continue;
        }
        auto g = std::find_if(layered.begin(), layered.end(), [&](const LayeredGroup& x) {
          return x.to == op->to && x.batch == op->options.batch;
        });
        if (g == layered.end()) {
          layered.push_back(LayeredGroup{op->to, op->options.batch, op->options.deadline, {}, {}});
          g = layered.end() - 1;
        }
        g->deadline = std::max(g->deadline, op->options.deadline);
        g->writes.push_back(BlockWrite{
            op->dst, op->key,
            {src->HostAddress(op->src), static_cast<size_t>(block_bytes)}, op->options.layers});
        g->ops.push_back(op);
        continue;
      }
      auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& x) {
        return x.from == op->from && x.batch == op->options.batch;
      });
      if (g == groups.end()) {
        groups.push_back(Group{op->from, op->options.batch, op->options.deadline, {}, {}});
        g = groups.end() - 1;
      }
      g->deadline = std::max(g->deadline, op->options.deadline);
      g->reads.push_back(plan.read);
      g->then.push_back(std::move(plan.then));
    }
    for (Group& g : groups) {
      std::vector<Completion> done =
          tiers[TierIndex(g.from)]->ReadBlocks(g.reads, {.deadline = g.deadline});
      for (size_t i = 0; i < done.size(); ++i) done[i].OnDone(std::move(g.then[i]));
    }
    std::weak_ptr<Impl> weak = weak_from_this();
    for (LayeredGroup& g : layered) {
      std::vector<Completion> done =
          tiers[TierIndex(g.to)]->WriteBlocks(g.writes, {.deadline = g.deadline});
      for (size_t i = 0; i < done.size(); ++i) {
        done[i].OnDone([weak, op = g.ops[i]](const absl::Status& s) {
          if (auto self = weak.lock()) self->Finish(op, s);
        });
      }
    }
  }
};

absl::StatusOr<std::unique_ptr<TransferEngine>> TransferEngine::Create(
    const TransferEngineOptions& options) {
  int64_t block_bytes = 0;
  for (int t = 0; t < kNumTiers; ++t) {
    const TierBackend* b = options.tiers[t];
    if (b == nullptr) continue;
    if (TierIndex(b->info().tier) != t) {
      return absl::InvalidArgumentError(absl::StrCat("TransferEngine: the ", b->info().name,
                                                     " backend is at the index of ",
                                                     ToAbsl(TierName(static_cast<Tier>(t)))));
    }
    if (block_bytes != 0 && b->info().block_bytes != block_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TransferEngine: ", b->info().name, " has ", b->info().block_bytes,
          "-byte blocks; the other tiers have ", block_bytes));
    }
    block_bytes = b->info().block_bytes;
  }
  if (block_bytes == 0) return absl::InvalidArgumentError("TransferEngine: no tier given");
  if (options.bounce_buffers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("TransferEngine: bounce_buffers = ",
                                                   options.bounce_buffers, " must be >= 1"));
  }
  KVTIER_ASSIGN_OR_RETURN(
      internal::HostRegion region,
      internal::HostRegion::Create(static_cast<size_t>(options.bounce_buffers * block_bytes),
                                   "TransferEngine bounce buffers"));
  auto impl = std::make_shared<Impl>(std::move(region));
  impl->tiers = options.tiers;
  impl->block_bytes = block_bytes;
  {
    internal::MutexLock lock(&impl->mu);
    for (int i = options.bounce_buffers - 1; i >= 0; --i) impl->free_bounce.push_back(i);
  }
  return std::unique_ptr<TransferEngine>(new TransferEngine(std::move(impl)));
}

TransferEngine::TransferEngine(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

TransferEngine::~TransferEngine() {
  std::vector<std::pair<std::shared_ptr<Impl::Op>, absl::Status>> cancelled;
  {
    internal::MutexLock lock(&impl_->mu);
    for (uint64_t id : impl_->waiting) {
      cancelled.emplace_back(impl_->ops[id],
                             absl::CancelledError("the transfer engine is shutting down"));
    }
    impl_->waiting.clear();
  }
  for (auto& [op, status] : cancelled) impl_->Finish(op, std::move(status));
  {
    internal::MutexLock lock(&impl_->mu);
    while (!impl_->ops.empty() || impl_->delivering > 0) impl_->idle_cv.Wait(&impl_->mu);
  }
  impl_->Shutdown();
}

absl::StatusOr<Transfer> TransferEngine::Copy(const BlockKey& key, Tier from, SlotId source,
                                              Tier to, const TransferOptions& options) {
  Impl* impl = impl_.get();
  if (!Present(impl->tiers, from) || !Present(impl->tiers, to)) {
    return absl::InvalidArgumentError(absl::StrCat("TransferEngine: no ",
                                                   Present(impl->tiers, from) ? "destination"
                                                                              : "source",
                                                   " tier ", static_cast<int>(
                                                       Present(impl->tiers, from) ? to : from)));
  }
  if (from == to) {
    return absl::InvalidArgumentError(absl::StrCat("TransferEngine: source and destination are "
                                                   "both ", ToAbsl(TierName(from))));
  }
  auto op = std::make_shared<Impl::Op>();
  bool run_inline = false;
  {
    internal::MutexLock lock(&impl->mu);
    KVTIER_ASSIGN_OR_RETURN(const SlotState state, impl->Alloc(from).state(source));
    const bool arriving = impl->pending_dst.contains(SlotKey(from, source));
    if (state != SlotState::kSealed && state != SlotState::kCached && !arriving) {
      return absl::FailedPreconditionError(absl::StrCat(
          "TransferEngine: the source, ", ToAbsl(TierName(from)), " slot ", source.value(),
          ", is ", ToAbsl(SlotStateName(state)), ": not a block"));
    }
    KVTIER_ASSIGN_OR_RETURN(op->dst, impl->Alloc(to).AllocateForTransfer());
    op->id = impl->next_id++;
    op->key = key;
    op->from = from;
    op->to = to;
    op->src = source;
    op->options = options;
    impl->ops[op->id] = op;
    impl->pending_dst[SlotKey(to, op->dst)] = op->id;
    impl->stats[TierIndex(from)][TierIndex(to)].operations += 1;
    // Between two inline tiers a copy that can start now runs here, start to finish: no
    // dispatcher round trip per block (a metadata-only replay moves hundreds of thousands).
    // One that must wait (its source arriving, its source_ready pending) queues as usual.
    if (impl->Inline(*op) && (!options.source_ready.has_value() ||
                              (options.source_ready->done() && options.source_ready->status().ok()))) {
      // A source that cannot be pinned queues, and Pump fails it through its Completion as
      // for any other copy.
      absl::StatusOr<bool> started = impl->TryStartLocked(*op);
      run_inline = started.ok() && *started;
    }
    if (!run_inline) impl->waiting.push_back(op->id);
    if (!run_inline && options.deadline != absl::InfiniteFuture() && impl->timer != nullptr) {
      std::weak_ptr<Impl> weak = impl->weak_from_this();
      const uint64_t id = op->id;
      op->timer_id = impl->timer->Schedule(options.deadline, [weak, id] {
        if (auto self = weak.lock()) self->OnDeadline(id);
      });
    }
  }
  if (run_inline) {
    impl->StartIo(op);  // its Completion has fired when this returns
    return Transfer{op->dst, op->user};
  }
  if (options.source_ready.has_value()) {
    std::weak_ptr<Impl> weak = impl->weak_from_this();
    options.source_ready->OnDone([weak](const absl::Status&) {
      if (auto self = weak.lock()) self->SchedulePump();
    });
  }
  if (!options.defer_start) impl->SchedulePump();
  return Transfer{op->dst, op->user};
}

void TransferEngine::StartDeferred() { impl_->SchedulePump(); }

absl::Status TransferEngine::WithAllocator(Tier tier,
                                           absl::FunctionRef<absl::Status(BlockAllocator&)> fn) {
  if (!Present(impl_->tiers, tier)) {
    return absl::InvalidArgumentError(
        absl::StrCat("TransferEngine: no tier ", static_cast<int>(tier)));
  }
  internal::MutexLock lock(&impl_->mu);
  return fn(impl_->Alloc(tier));
}

absl::Status TransferEngine::WithAllocators(
    absl::FunctionRef<absl::Status(const std::array<BlockAllocator*, kNumTiers>&)> fn) {
  std::array<BlockAllocator*, kNumTiers> allocators{};
  internal::MutexLock lock(&impl_->mu);
  for (int t = 0; t < kNumTiers; ++t) {
    if (impl_->tiers[t] != nullptr) allocators[t] = &impl_->tiers[t]->allocator();
  }
  return fn(allocators);
}

TransferStats TransferEngine::stats(Tier from, Tier to) const {
  if (TierIndex(from) < 0 || TierIndex(from) >= kNumTiers || TierIndex(to) < 0 ||
      TierIndex(to) >= kNumTiers) {
    return {};
  }
  internal::MutexLock lock(&impl_->mu);
  return impl_->stats[TierIndex(from)][TierIndex(to)];
}

int64_t TransferEngine::in_flight() const {
  internal::MutexLock lock(&impl_->mu);
  return static_cast<int64_t>(impl_->ops.size());
}

}  // namespace kvtier
