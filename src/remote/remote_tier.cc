// RemoteTier (remote_tier.h): framed, checksummed blocks over a Transport, behind a breaker.
#include "kvtier/remote_tier.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "internal/mutex.h"
#include "internal/status_macros.h"
#include "internal/strings.h"
#include "kvtier/value_frame.h"
#include "remote/circuit_breaker.h"
#include "tiers/slot_contents.h"

namespace kvtier {

// What completion callbacks share with the tier. It holds no transport: a callback runs on the
// transport's thread and may drop the last reference to this state there, which must never
// destroy the transport on its own thread (it would join itself).
struct RemoteTier::Impl {
  explicit Impl(const RemoteTierOptions& o)
      : options(o), breaker(o.breaker_failures, o.breaker_backoff_min, o.breaker_backoff_max) {
    options.transport.reset();
  }
  RemoteTierOptions options;  // without the transport
  std::array<uint8_t, 16> ns_digest{};
  TierInfo info;
  std::unique_ptr<BlockAllocator> allocator;
  std::unique_ptr<internal::SlotContents> contents;
  std::atomic<int64_t> corrupt_reads{0};
  std::atomic<int64_t> deleted_keys{0};
  // Per slot: its value was stored by this tier's own write (DiscardBlock deletes only those).
  std::unique_ptr<std::atomic<bool>[]> stored_here;
  std::atomic<int64_t> bytes_written{0};
  // Blocks whose stored value read as corrupt: their next write replaces it (not if_absent).
  internal::Mutex corrupt_mu;
  absl::flat_hash_set<BlockKey> corrupt_keys ABSL_GUARDED_BY(corrupt_mu);
  bool ReplaceNextWrite(const BlockKey& key) {
    internal::MutexLock lock(&corrupt_mu);
    return corrupt_keys.erase(key) > 0;
  }
  void NoteCorrupt(const BlockKey& key) {
    internal::MutexLock lock(&corrupt_mu);
    if (corrupt_keys.size() < 65536) corrupt_keys.insert(key);  // bounded: a hostile store
  }
  std::atomic<int64_t> writes_skipped{0};

  // Deletes DiscardBlock sent that the store has not answered, by store key. A write of such a
  // key waits for its delete first: Redis sends the two on different connections in no order,
  // and a delete landing after a write (skipped as if_absent, or not) would take the value the
  // tier now says it holds; a probe reads the key as absent. Each delete is bounded by 1 s, so
  // the map is small.
  struct InFlightDelete {
    Completion done;
    uint64_t id = 0;
  };
  internal::Mutex delete_mu;
  absl::flat_hash_map<std::string, InFlightDelete> deletes_in_flight ABSL_GUARDED_BY(delete_mu);
  uint64_t next_delete_id ABSL_GUARDED_BY(delete_mu) = 0;
  // The deletes in flight of these keys (none answered yet), by position in `puts`.
  std::vector<std::pair<size_t, Completion>> DeletesOf(absl::Span<const TransportPut> puts) {
    std::vector<std::pair<size_t, Completion>> out;
    internal::MutexLock lock(&delete_mu);
    if (deletes_in_flight.empty()) return out;
    for (size_t j = 0; j < puts.size(); ++j) {
      auto it = deletes_in_flight.find(puts[j].key);
      if (it != deletes_in_flight.end()) out.emplace_back(j, it->second.done);
    }
    return out;
  }

  std::atomic<int64_t> probes{0};
  std::atomic<int64_t> probe_failures{0};
  std::atomic<int64_t> probe_hits{0};
  internal::CircuitBreaker breaker;

  // RemoteBlockKey(options.key_prefix, ns_digest, key), with the part before the block key
  // (prefix, namespace hex, ':') made once: a probe asks for dozens of keys per request.
  std::string key_head;
  std::string StoreKey(const BlockKey& key) const {
    std::string out;
    out.reserve(key_head.size() + 32);
    out.append(key_head);
    out.append(key.ToHex());
    return out;
  }
  // The largest valid frame: the header plus a block that compression made slightly bigger.
  int64_t MaxFrameBytes() const {
    return static_cast<int64_t>(kFrameHeaderBytes) + info.block_bytes + info.block_bytes / 128 +
           4096;
  }
};

absl::StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::Create(const CacheNamespace& ns,
                                                               const RemoteTierOptions& options) {
  if (options.transport == nullptr) {
    return absl::InvalidArgumentError("RemoteTier: the transport is null");
  }
  if (options.capacity_blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("RemoteTier: capacity_blocks = ", options.capacity_blocks, " must be >= 1"));
  }
  const int64_t block_bytes = ns.geometry().bytes_per_block();
  if (options.capacity_blocks > std::numeric_limits<int64_t>::max() / block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("RemoteTier: capacity_blocks = ", options.capacity_blocks, " of ", block_bytes,
                     " bytes overflows a 64-bit byte count"));
  }
  if (options.key_prefix.size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RemoteTier: a key prefix of ", options.key_prefix.size(), " bytes; at most 64"));
  }
  for (const char c : options.key_prefix) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' &&
        c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("RemoteTier: the key prefix \"", options.key_prefix,
                       "\" may use only letters, digits and . _ : -"));
    }
  }
  if (options.codec == Codec::kFp8E4m3 && ns.geometry().dtype() != KvDtype::kBf16) {
    return absl::InvalidArgumentError(
        absl::StrCat("RemoteTier: codec fp8_e4m3 converts bf16 KV; this namespace's dtype is ",
                     internal::ToAbsl(KvDtypeName(ns.geometry().dtype()))));
  }
  if (options.breaker_failures < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RemoteTier: breaker_failures = ", options.breaker_failures, " must be >= 0"));
  }
  if (options.breaker_backoff_min <= absl::ZeroDuration() ||
      options.breaker_backoff_max < options.breaker_backoff_min) {
    return absl::InvalidArgumentError(
        "RemoteTier: the breaker backoff must satisfy 0 < min <= max");
  }
  if (options.delete_wait < absl::ZeroDuration() ||
      options.delete_wait == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RemoteTier: delete_wait = ", absl::FormatDuration(options.delete_wait),
                     " must be >= 0 and finite"));
  }
  auto impl = std::make_shared<Impl>(options);
  std::shared_ptr<Transport> transport = options.transport;
  impl->ns_digest = ns.digest();
  impl->key_head = RemoteBlockKey(options.key_prefix, impl->ns_digest, BlockKey{});
  impl->key_head.resize(impl->key_head.size() - 32);  // less the block key's 32 hex digits
  KVTIER_ASSIGN_OR_RETURN(impl->allocator,
                          BlockAllocator::Create(Tier::kRemote, options.capacity_blocks));
  impl->contents = std::make_unique<internal::SlotContents>(options.capacity_blocks);
  impl->stored_here =
      std::make_unique<std::atomic<bool>[]>(static_cast<size_t>(options.capacity_blocks));
  TierInfo& info = impl->info;
  info.tier = Tier::kRemote;
  info.name = absl::StrCat(
      "remote(", options.transport->name(), ", ",
      absl::string_view(CodecName(options.codec).data(), CodecName(options.codec).size()),
      options.hmac_secret.empty() ? "" : ", hmac", ")");
  info.capacity_blocks = options.capacity_blocks;
  info.block_bytes = block_bytes;
  info.capacity_bytes = info.capacity_blocks * info.block_bytes;
  info.metadata_bytes =
      info.capacity_blocks * (8 + internal::SlotContents::kBytesPerSlot + kFrameHeaderBytes);
  info.capabilities = kCapPersistent | kCapChecksummed | kCapProbe;
  return std::unique_ptr<RemoteTier>(new RemoteTier(std::move(impl), std::move(transport)));
}

RemoteTier::RemoteTier(std::shared_ptr<Impl> impl, std::shared_ptr<Transport> transport)
    : impl_(std::move(impl)), transport_(std::move(transport)) {}
RemoteTier::~RemoteTier() = default;

const TierInfo& RemoteTier::info() const { return impl_->info; }
BlockAllocator& RemoteTier::allocator() { return *impl_->allocator; }
int64_t RemoteTier::corrupt_reads() const { return impl_->corrupt_reads.load(); }

RemoteHealth RemoteTier::health() const {
  switch (impl_->breaker.state()) {
    case internal::CircuitBreaker::State::kClosed:
      return RemoteHealth::kHealthy;
    case internal::CircuitBreaker::State::kOpen:
      return RemoteHealth::kBypassed;
    case internal::CircuitBreaker::State::kHalfOpen:
      return RemoteHealth::kProbing;
  }
  return RemoteHealth::kHealthy;
}
int64_t RemoteTier::deleted_keys() const { return impl_->deleted_keys.load(); }
int64_t RemoteTier::bytes_written() const { return impl_->bytes_written.load(); }
int64_t RemoteTier::writes_skipped() const { return impl_->writes_skipped.load(); }

void RemoteTier::DiscardBlock(SlotId slot, const BlockKey& key) {
  if (!impl_->options.delete_freed || !slot.valid() ||
      slot.value() >= static_cast<uint64_t>(impl_->info.capacity_blocks) ||
      !impl_->contents->Check(slot, key, impl_->info).ok()) {
    return;
  }
  impl_->contents->Invalidate(slot);
  if (!impl_->stored_here[slot.value()].exchange(false)) return;  // not ours to delete
  // A delete is housekeeping: it never opens or closes the breaker, and none is sent to a
  // store the breaker does not trust.
  if (impl_->breaker.state() != internal::CircuitBreaker::State::kClosed) return;
  const std::string store_key = impl_->StoreKey(key);
  Completion sent = transport_->Delete({&store_key, 1}, absl::Now() + absl::Seconds(1))[0];
  impl_->deleted_keys.fetch_add(1);
  if (sent.done()) return;  // answered before Delete returned (InProcessTransport)
  uint64_t id = 0;
  {
    internal::MutexLock lock(&impl_->delete_mu);
    id = ++impl_->next_delete_id;
    impl_->deletes_in_flight[store_key] = {sent, id};
  }
  // Runs at once if the store answered meanwhile. A weak reference: the map holds this
  // completion, so a strong one would keep the tier's state alive for a delete never answered.
  sent.OnDone([weak = std::weak_ptr<Impl>(impl_), store_key, id](const absl::Status&) {
    const std::shared_ptr<Impl> impl = weak.lock();
    if (impl == nullptr) return;
    internal::MutexLock lock(&impl->delete_mu);
    auto it = impl->deletes_in_flight.find(store_key);
    if (it != impl->deletes_in_flight.end() && it->second.id == id) {
      impl->deletes_in_flight.erase(it);
    }
  });
}

int64_t RemoteTier::breaker_opened() const { return impl_->breaker.opened(); }
int64_t RemoteTier::bypassed_requests() const { return impl_->breaker.bypassed(); }

std::string RemoteTier::StoreKey(const BlockKey& key) const { return impl_->StoreKey(key); }
int64_t RemoteTier::probes() const { return impl_->probes.load(); }
int64_t RemoteTier::probe_failures() const { return impl_->probe_failures.load(); }
int64_t RemoteTier::probe_hits() const { return impl_->probe_hits.load(); }

absl::StatusOr<std::vector<bool>> RemoteTier::ProbeBlocks(absl::Span<const BlockKey> keys,
                                                          absl::Time deadline) {
  std::vector<bool> found(keys.size(), false);
  if (keys.empty()) return found;
  if (absl::Now() >= deadline) {
    impl_->probe_failures.fetch_add(1);
    return absl::DeadlineExceededError("RemoteTier: the probe's deadline has passed");
  }
  // Refused at once while the breaker is open: a dead store costs a probe nothing. The keys are
  // not counted as bypassed blocks (bypassed_requests counts reads and writes).
  if (absl::Status admitted = impl_->breaker.Admit(absl::Now(), 0); !admitted.ok()) {
    impl_->probe_failures.fetch_add(1);
    return admitted;
  }
  std::vector<std::string> store_keys;
  store_keys.reserve(keys.size());
  for (const BlockKey& k : keys) store_keys.push_back(impl_->StoreKey(k));
  impl_->probes.fetch_add(1);
  const absl::Time started = absl::Now();
  std::vector<Completion> answers = transport_->Exists(store_keys, deadline);
  // The transport completes every item by the deadline; the wait is bounded by it as well, so a
  // transport that breaks that promise still cannot hold the caller longer. Exists keeps no
  // buffer of ours, so an item left pending here is simply abandoned.
  bool answered = false;
  absl::Status failure;
  int64_t hits = 0;
  for (size_t i = 0; i < answers.size() && i < keys.size(); ++i) {
    const absl::Status s = answers[i].WaitUntil(deadline);
    if (s.ok()) {
      found[i] = true;
      answered = true;
      ++hits;
    } else if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
      if (failure.ok()) failure = s;
    } else if (!absl::IsCancelled(s) && !absl::IsInvalidArgument(s)) {
      answered = true;  // kNotFound, or another answer: the store is there
    }
  }
  if (answered) {
    impl_->breaker.Report(absl::OkStatus(), absl::Now(), started, deadline);
  } else if (!failure.ok()) {
    impl_->breaker.Report(failure, absl::Now(), started, deadline);
  }
  if (!answered) {
    impl_->probe_failures.fetch_add(1);
    if (failure.ok()) failure = absl::UnavailableError("RemoteTier: the store answered no key");
    return failure;
  }
  {
    // A block this tier is deleting is not found, whether or not the delete has landed yet
    // (a Redis probe and delete travel on different connections, in no order).
    internal::MutexLock lock(&impl_->delete_mu);
    if (!impl_->deletes_in_flight.empty()) {
      for (size_t i = 0; i < found.size(); ++i) {
        if (found[i] && impl_->deletes_in_flight.contains(store_keys[i])) {
          found[i] = false;
          --hits;
        }
      }
    }
  }
  impl_->probe_hits.fetch_add(hits);
  return found;
}

absl::Status RemoteTier::AdoptStoredBlock(SlotId slot, const BlockKey& key) {
  if (slot.value() >= static_cast<uint64_t>(impl_->info.capacity_blocks)) {
    return absl::InvalidArgumentError(absl::StrCat("RemoteTier: slot ", slot.value(),
                                                   " is outside the tier's ",
                                                   impl_->info.capacity_blocks, " slots"));
  }
  impl_->contents->Set(slot, key);
  impl_->stored_here[slot.value()].store(false);  // another writer's value
  return absl::OkStatus();
}

Completion RemoteTier::WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                                  const BlockIoOptions& options) {
  const BlockWrite write{slot, key, src};
  return WriteBlocks({&write, 1}, options)[0];
}

Completion RemoteTier::ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                                 const BlockIoOptions& options) {
  const BlockRead read{slot, key, dst};
  return ReadBlocks({&read, 1}, options)[0];
}

namespace {

// One breaker report for a whole batch, once its last block completes: an answer for any block
// is the store's health; only a batch none of whose blocks got one is a failure (so one slow
// batch of many blocks counts once, not once per block).
class BatchHealth {
 public:
  BatchHealth(internal::CircuitBreaker* breaker, size_t blocks, std::shared_ptr<const void> keep,
              absl::Time started, absl::Time deadline)
      : breaker_(breaker),
        pending_(static_cast<int64_t>(blocks)),
        keep_(std::move(keep)),
        started_(started),
        deadline_(deadline) {}
  void Add(const absl::Status& s) {
    {
      internal::MutexLock lock(&mu_);
      if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
        if (failure_.ok()) failure_ = s;
      } else if (!absl::IsCancelled(s) && !absl::IsInvalidArgument(s)) {
        answered_ = true;
      }
    }
    if (pending_.fetch_sub(1) != 1) return;
    internal::MutexLock lock(&mu_);
    if (answered_) {
      breaker_->Report(absl::OkStatus(), absl::Now(), started_, deadline_);
    } else if (!failure_.ok()) {
      breaker_->Report(failure_, absl::Now(), started_, deadline_);
    }
  }

 private:
  internal::CircuitBreaker* breaker_;
  std::atomic<int64_t> pending_;
  std::shared_ptr<const void> keep_;  // owns *breaker_
  const absl::Time started_;          // when the batch went to the store
  const absl::Time deadline_;         // the batch's deadline
  internal::Mutex mu_;
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

// The one way a batch goes to the store: admitted through the breaker (refused at once when it
// is open), started with one transport call, and each block's completion fired after `on_block`
// has recorded its outcome; the breaker hears once for the whole batch.
// `start` returns one Completion per entry of `index`; `on_block(i)` returns what to run on the
// outcome of block out[i]: it records it and returns the status out[i] completes with.
template <typename Start, typename OnBlock>
void RunBatch(internal::CircuitBreaker& breaker, std::shared_ptr<const void> keep,
              absl::Time deadline, absl::Span<const size_t> index, std::vector<Completion>& out,
              Start start, OnBlock on_block) {
  if (index.empty()) return;
  if (absl::Status admitted = breaker.Admit(absl::Now(), static_cast<int64_t>(index.size()));
      !admitted.ok()) {
    for (size_t i : index) out[i] = Completion::Done(admitted);
    return;
  }
  const absl::Time sent = absl::Now();
  std::vector<Completion> started = start();
  auto health =
      std::make_shared<BatchHealth>(&breaker, index.size(), std::move(keep), sent, deadline);
  for (size_t j = 0; j < index.size(); ++j) {
    const size_t i = index[j];
    Completion done;
    out[i] = done;
    started[j].OnDone([health, record = on_block(i), done](const absl::Status& s) {
      health->Add(s);
      done.Complete(record(s));
    });
  }
}

// Receives one frame: header into its own array, payload into the destination block when it has
// the block's size (codec none), else into scratch memory to decode from. The checksum runs over
// each piece as it lands (FrameVerifier), so a 2 MiB block is not read a second time.
class FrameReceiver final : public TransportReceiver {
 public:
  FrameReceiver(std::shared_ptr<const void> keep, const std::array<uint8_t, 16>& ns_digest,
                const std::string& secret, const BlockKey& key, absl::Span<std::byte> dst,
                bool accept_lossy)
      : keep_(std::move(keep)),
        key_(key),
        dst_(dst),
        verifier_(ns_digest, key, secret, dst, accept_lossy) {}

  absl::StatusOr<std::vector<absl::Span<std::byte>>> Begin(int64_t length) override {
    if (length < static_cast<int64_t>(kFrameHeaderBytes)) {
      return absl::DataLossError(absl::StrCat("remote value for block ", key_.ToHex(), ": ", length,
                                              " bytes, shorter than a frame header"));
    }
    const auto payload_bytes = static_cast<size_t>(length) - kFrameHeaderBytes;
    if (payload_bytes == dst_.size()) {
      payload_ = dst_;
    } else {
      scratch_.resize(payload_bytes);
      payload_ = absl::MakeSpan(scratch_);
    }
    return std::vector<absl::Span<std::byte>>{absl::MakeSpan(header_), payload_};
  }
  void Received(absl::Span<const std::byte> piece) override {
    // The first kFrameHeaderBytes are the header (its own buffer); the rest is payload.
    if (header_seen_ < kFrameHeaderBytes) {
      const size_t n = std::min(piece.size(), kFrameHeaderBytes - header_seen_);
      header_seen_ += n;
      piece.remove_prefix(n);
      if (header_seen_ == kFrameHeaderBytes) {
        (void)verifier_.Header(header_, payload_.size());  // an error resurfaces in Finish
      }
    }
    if (!piece.empty()) verifier_.Payload(piece);
  }
  absl::Status Finish() override { return verifier_.Finish(payload_); }

 private:
  std::shared_ptr<const void> keep_;  // the tier state (kept alive for its lifetime rules)
  BlockKey key_;
  absl::Span<std::byte> dst_;
  FrameVerifier verifier_;
  std::array<std::byte, kFrameHeaderBytes> header_{};
  size_t header_seen_ = 0;
  std::vector<std::byte> scratch_;
  absl::Span<std::byte> payload_;
};

}  // namespace

std::vector<Completion> RemoteTier::WriteBlocks(absl::Span<const BlockWrite> writes,
                                                const BlockIoOptions& options) {
  std::vector<Completion> out(writes.size());
  // Each frame goes as its header and its payload: with codec none the payload is the caller's
  // block itself (WriteBlock's contract keeps it valid until the completion), so no copy.
  struct Frame {
    std::array<std::byte, kFrameHeaderBytes> header;
    std::vector<std::byte> storage;  // the encoded payload, for codecs other than none
  };
  auto frames = std::make_shared<std::vector<Frame>>(writes.size());
  std::vector<TransportPut> puts;
  std::vector<size_t> index;
  std::vector<int64_t> put_bytes(writes.size());  // per write: its frame's bytes
  // Per write: it replaces a value that read as corrupt. If it does not land, the mark goes
  // back, or the next write would be if_absent, be skipped, and leave the damage for good.
  std::vector<bool> replacing(writes.size(), false);
  puts.reserve(writes.size());
  for (size_t i = 0; i < writes.size(); ++i) {
    const BlockWrite& w = writes[i];
    Frame& f = (*frames)[i];
    if (absl::Status s =
            internal::CheckBlockIoNow(impl_->info, w.slot, w.src.size(), options.deadline);
        !s.ok()) {
      out[i] = Completion::Done(std::move(s));
      continue;
    }
    absl::StatusOr<absl::Span<const std::byte>> payload =
        EncodeFrameParts(impl_->ns_digest, w.key, w.src, impl_->options.codec,
                         impl_->options.hmac_secret, &f.header, &f.storage);
    if (!payload.ok()) {
      out[i] = Completion::Done(payload.status());
      continue;
    }
    impl_->contents->Invalidate(w.slot);
    put_bytes[i] = static_cast<int64_t>(f.header.size() + payload->size());
    replacing[i] = impl_->ReplaceNextWrite(w.key);
    puts.push_back(TransportPut{.key = impl_->StoreKey(w.key),
                                .value = *payload,
                                .value_prefix = f.header,
                                .if_absent = impl_->options.write_if_absent && !replacing[i]});
    index.push_back(i);
  }
  std::shared_ptr<Impl> impl = impl_;
  // Sends `batch` (the puts of writes `batch_index`) as one transport call.
  const auto send = [&](absl::Span<const TransportPut> batch,
                        absl::Span<const size_t> batch_index) {
    RunBatch(
        impl_->breaker, impl_, options.deadline, batch_index, out,
        [&] { return transport_->Put(batch, options.deadline); },
        [&](size_t i) {
          const int64_t bytes = put_bytes[i];
          // A bool, not a vector<bool> reference: the lambda outlives `replacing` (it runs when
          // the transport answers, after WriteBlocks returned; ASan found the reference).
          const bool replace = replacing[i];
          return [impl, frames, slot = writes[i].slot, key = writes[i].key, bytes,
                  replace](const absl::Status& s) -> absl::Status {
            // Skipped because the store has the block (if_absent): content-addressed, so that
            // is the block, written by another worker or an earlier run.
            const bool present = absl::IsAlreadyExists(s);
            if (replace && !s.ok()) impl->NoteCorrupt(key);
            if (s.ok()) impl->bytes_written.fetch_add(bytes);
            if (present) impl->writes_skipped.fetch_add(1);
            if (s.ok() || present) impl->contents->Set(slot, key);
            if (s.ok() || present) impl->stored_here[slot.value()].store(s.ok());
            return present ? absl::OkStatus() : s;
          };
        });
  };
  // A write of a key whose delete is still in flight goes after it (a delete landing later
  // would take the value), in a second batch, so the others do not wait: at most delete_wait
  // and the write's deadline; a write whose delete is not answered by then fails rather than be
  // undone.
  const std::vector<std::pair<size_t, Completion>> deletes = impl_->DeletesOf(puts);
  if (deletes.empty()) {
    send(puts, index);  // the common case: no copies
  } else {
    // Per write (position in puts / index): sent now, after its delete, or not at all.
    enum class When : uint8_t { kNow, kAfterDelete, kNever };
    std::vector<When> when(puts.size(), When::kNow);
    for (const auto& [j, done] : deletes) when[j] = When::kAfterDelete;
    const auto send_those = [&](When which) {
      std::vector<TransportPut> batch;
      std::vector<size_t> batch_index;
      for (size_t j = 0; j < puts.size(); ++j) {
        if (when[j] != which) continue;
        batch.push_back(puts[j]);
        batch_index.push_back(index[j]);
      }
      send(batch, batch_index);
    };
    send_those(When::kNow);
    // This runs on the caller's thread (the transfer engine's dispatcher): at most delete_wait
    // (a store answers in a round trip), however late the write's deadline.
    const absl::Time until = std::min(options.deadline, absl::Now() + impl_->options.delete_wait);
    for (const auto& [j, done] : deletes) {
      (void)done.WaitUntil(until);
      if (done.done()) continue;  // answered (one the transport timed out may yet land: header)
      when[j] = When::kNever;
      out[index[j]] = Completion::Done(absl::UnavailableError(absl::StrCat(
          "RemoteTier: the store had not answered a delete of the block's old value within ",
          absl::FormatDuration(impl_->options.delete_wait), " or by the write's deadline")));
    }
    send_those(When::kAfterDelete);
  }
  // A batch the breaker refused never reached the store, and a write a delete outlived never
  // left (their blocks completed at once).
  for (size_t i : index) {
    if (replacing[i] && out[i].done() && !out[i].status().ok()) impl_->NoteCorrupt(writes[i].key);
  }
  return out;
}

std::vector<Completion> RemoteTier::ReadBlocks(absl::Span<const BlockRead> reads,
                                               const BlockIoOptions& options) {
  std::vector<Completion> out(reads.size());
  std::vector<TransportGet> gets;
  std::vector<size_t> index;
  gets.reserve(reads.size());
  for (size_t i = 0; i < reads.size(); ++i) {
    const BlockRead& r = reads[i];
    absl::Status s = internal::CheckBlockIoNow(impl_->info, r.slot, r.dst.size(), options.deadline);
    if (s.ok()) s = impl_->contents->Check(r.slot, r.key, impl_->info);
    if (!s.ok()) {
      out[i] = Completion::Done(std::move(s));
      continue;
    }
    // The frame's header lands in the receiver and its payload straight in the caller's block
    // (or in scratch memory when it is encoded); then it is verified and decoded.
    TransportGet get;
    get.key = impl_->StoreKey(r.key);
    get.max_bytes = impl_->MaxFrameBytes();
    // A lossy frame (another worker's fp8) is foreign to a reader that did not opt into it.
    get.receiver =
        std::make_shared<FrameReceiver>(impl_, impl_->ns_digest, impl_->options.hmac_secret, r.key,
                                        r.dst, CodecIsLossy(impl_->options.codec));
    gets.push_back(std::move(get));
    index.push_back(i);
  }
  std::shared_ptr<Impl> impl = impl_;
  RunBatch(
      impl_->breaker, impl_, options.deadline, index, out,
      [&] { return transport_->Get(gets, options.deadline); },
      [&](size_t i) {
        return [impl, slot = reads[i].slot, key = reads[i].key](const absl::Status& s) {
          // kDataLoss: an oversized value, or one that failed verification in the receiver.
          if (absl::IsDataLoss(s)) {
            impl->corrupt_reads.fetch_add(1);
            impl->NoteCorrupt(key);
          }
          // Keyed: a write of another block into the slot meanwhile stays recorded.
          if (absl::IsNotFound(s) || absl::IsDataLoss(s)) {
            (void)impl->contents->InvalidateIfHolds(slot, key);
          }
          return s;
        };
      });
  return out;
}

}  // namespace kvtier
