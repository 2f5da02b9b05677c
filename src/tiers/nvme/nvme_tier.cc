// NvmeTier (nvme_tier.h): slots of a preallocated O_DIRECT file with self-describing headers.
#include "kvtier/nvme_tier.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/byte_writer.h"
#include "internal/deadline_timer.h"
#include "internal/host_region.h"
#include "internal/mutex.h"
#include "internal/status_macros.h"
#include "tiers/nvme/io_engine.h"
#include "tiers/slot_contents.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvtier {
namespace {

// Slot header, format version 1 (docs/formats.md, "NVMe slot"). All integers little-endian.
constexpr uint64_t kMagic = 0x31424c4254564b4bULL;  // "KKVTBLB1" read as little-endian bytes
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderChecksummedBytes = 56;      // the header checksum covers bytes [0, 56)

struct Header {
  uint64_t magic = 0;
  uint32_t version = 0;
  uint32_t header_bytes = 0;
  BlockKey key;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;
  uint64_t write_sequence = 0;
  uint64_t header_checksum = 0;
};

uint64_t LoadU64Le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint32_t LoadU32Le(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void EncodeHeader(const Header& h, uint8_t* out) {
  std::memset(out, 0, NvmeTier::kHeaderBytes);
  std::vector<uint8_t> buf;
  internal::ByteWriter w(&buf);
  w.U64(h.magic);
  w.U32(h.version);
  w.U32(h.header_bytes);
  const std::array<uint8_t, 16> key = h.key.ToBytes();
  w.Bytes(key.data(), key.size());
  w.U64(h.payload_bytes);
  w.U64(h.payload_checksum);
  w.U64(h.write_sequence);
  std::memcpy(out, buf.data(), buf.size());
  const uint64_t sum = XXH3_64bits(out, kHeaderChecksummedBytes);
  for (int i = 0; i < 8; ++i) out[kHeaderChecksummedBytes + i] = static_cast<uint8_t>(sum >> (8 * i));
}

// Decodes and checks a header; `why` says what is wrong when it returns false.
bool DecodeHeader(const uint8_t* in, int64_t block_bytes, Header* h, std::string* why) {
  h->magic = LoadU64Le(in);
  if (h->magic != kMagic) {
    *why = "no block header";
    return false;
  }
  h->version = LoadU32Le(in + 8);
  h->header_bytes = LoadU32Le(in + 12);
  std::array<uint8_t, 16> key;
  std::memcpy(key.data(), in + 16, 16);
  h->key = BlockKey::FromBytes(key);
  h->payload_bytes = LoadU64Le(in + 32);
  h->payload_checksum = LoadU64Le(in + 40);
  h->write_sequence = LoadU64Le(in + 48);
  h->header_checksum = LoadU64Le(in + 56);
  if (XXH3_64bits(in, kHeaderChecksummedBytes) != h->header_checksum) {
    *why = "header checksum mismatch (torn or corrupt header)";
    return false;
  }
  if (h->version != kFormatVersion || h->header_bytes != NvmeTier::kHeaderBytes) {
    *why = absl::StrCat("unsupported header version ", h->version);
    return false;
  }
  if (static_cast<int64_t>(h->payload_bytes) != block_bytes) {
    *why = absl::StrCat("payload of ", h->payload_bytes, " bytes, expected ", block_bytes);
    return false;
  }
  return true;
}

absl::Status FromErrno(int err, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOSPC:
    case EFBIG:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    case EINVAL:
      return absl::InternalError(message);  // alignment or a kernel that refuses O_DIRECT
    default:
      return absl::UnavailableError(message);
  }
}

}  // namespace

struct NvmeTier::Impl {
  int fd = -1;
  KvGeometry geometry;
  int64_t slot_bytes = 0;
  TierInfo info;
  std::unique_ptr<BlockAllocator> allocator;
  std::vector<RecoveredBlock> recovered;
  std::unique_ptr<internal::SlotContents> contents;
  std::atomic<int64_t> corrupt_reads{0};
  std::atomic<uint64_t> write_sequence{1};

  // Staging buffers: one slot each, 4 KiB aligned, registered with io_uring.
  internal::HostRegion staging;
  int staging_count = 0;
  bool staging_registered = false;

  // A request that found no staging buffer free. Reads and writes never wait for one: the
  // request queues here, the release that frees a buffer starts the oldest, and `timer` fails it
  // at its deadline. (A caller that waited would stall its thread, and the transfer engine's one
  // dispatcher with it, behind a slow device.)
  struct Waiter {
    absl::Time deadline;
    uint64_t timer_id = 0;  // 0: no timer (an infinite deadline)
    SlotId slot;
    Completion done;
    // Fills staging buffer `index` and returns the request to submit, or nullopt when it ended
    // without one (it has completed `done` itself).
    std::function<std::optional<internal::IoRequest>(int index)> start;
  };
  mutable internal::Mutex staging_mu;
  std::vector<int> free_staging ABSL_GUARDED_BY(staging_mu);
  std::map<uint64_t, Waiter> waiting ABSL_GUARDED_BY(staging_mu);  // by arrival
  uint64_t next_waiter ABSL_GUARDED_BY(staging_mu) = 1;
  bool closing ABSL_GUARDED_BY(staging_mu) = false;
  // Releases between taking a waiter and submitting it: the destructor waits for them, so no
  // request reaches the engine once it drains.
  int starting ABSL_GUARDED_BY(staging_mu) = 0;
  internal::CondVar started_cv;
  // Expires waiters; stopped before anything it touches goes.
  std::unique_ptr<internal::DeadlineTimer> timer = std::make_unique<internal::DeadlineTimer>();

  // Last: destroyed first, so every operation in flight drains while the above still exist.
  std::unique_ptr<internal::IoEngine> engine;

  explicit Impl(const KvGeometry& g, internal::HostRegion region)
      : geometry(g), staging(std::move(region)) {}
  ~Impl() {
    // Requests still queued never started: they fail, and releases stop starting others.
    std::map<uint64_t, Waiter> left;
    {
      internal::MutexLock lock(&staging_mu);
      closing = true;
      left.swap(waiting);
      while (starting > 0) started_cv.Wait(&staging_mu);
    }
    timer.reset();
    for (auto& [id, w] : left) {
      w.done.Complete(absl::UnavailableError(
          absl::StrCat(info.name, ": slot ", w.slot.value(),
                       ": the tier was closed before the operation could start")));
    }
    engine.reset();
    if (fd >= 0) close(fd);
  }

  uint8_t* Staging(int index) const {
    return reinterpret_cast<uint8_t*>(staging.data()) + static_cast<int64_t>(index) * slot_bytes;
  }

  // Runs `start` on a free staging buffer now, appending its request to `batch`, or queues it
  // behind the requests already waiting (first come, first served). Never waits.
  void StartOrQueue(SlotId slot, absl::Time deadline, Completion done,
                    std::function<std::optional<internal::IoRequest>(int)> start,
                    std::vector<internal::IoRequest>& batch) {
    int index = -1;
    bool closed = false;
    {
      internal::MutexLock lock(&staging_mu);
      if (closing) {
        closed = true;  // a callback of this tier's, calling while it is destroyed
      } else if (waiting.empty() && !free_staging.empty()) {
        index = free_staging.back();
        free_staging.pop_back();
      } else {
        const uint64_t id = next_waiter++;
        Waiter& w = waiting[id];
        w.deadline = deadline;
        w.slot = slot;
        w.done = std::move(done);
        w.start = std::move(start);
        if (deadline != absl::InfiniteFuture()) {
          w.timer_id = timer->Schedule(deadline, [this, id] { Expire(id); });
        }
        return;
      }
    }
    if (closed) {
      done.Complete(absl::UnavailableError(
          absl::StrCat(info.name, ": slot ", slot.value(), ": the tier is being destroyed")));
      return;
    }
    if (std::optional<internal::IoRequest> r = start(index); r.has_value()) {
      batch.push_back(std::move(*r));
    } else {
      ReleaseStaging(index);
    }
  }

  // The timer's: waiter `id`, if still queued, could not start by its deadline.
  void Expire(uint64_t id) {
    Completion done;
    SlotId slot;
    {
      internal::MutexLock lock(&staging_mu);
      const auto it = waiting.find(id);
      if (it == waiting.end()) return;  // started (or failed) meanwhile
      done = std::move(it->second.done);
      slot = it->second.slot;
      waiting.erase(it);
    }
    done.Complete(internal::DeadlinePassed(info, slot));
  }

  // Buffer `index` is free (its request's completion has arrived): it starts the oldest waiter
  // whose deadline has not passed, or goes back to the free list.
  void ReleaseStaging(int index) {
    internal::MutexLock lock(&staging_mu);
    while (!closing && !waiting.empty()) {
      Waiter next = std::move(waiting.begin()->second);
      waiting.erase(waiting.begin());
      ++starting;
      staging_mu.Unlock();
      if (next.timer_id != 0) timer->Cancel(next.deadline, next.timer_id);
      bool submitted = false;
      if (absl::Now() > next.deadline) {
        next.done.Complete(internal::DeadlinePassed(info, next.slot));
      } else if (std::optional<internal::IoRequest> r = next.start(index); r.has_value()) {
        std::vector<internal::IoRequest> one;
        one.push_back(std::move(*r));
        engine->Submit(std::move(one));
        submitted = true;
      }
      staging_mu.Lock();
      --starting;
      started_cv.SignalAll();
      if (submitted) return;
    }
    free_staging.push_back(index);
  }

  internal::IoRequest Request(bool write, SlotId slot, int staging_index) const {
    internal::IoRequest r;
    r.write = write;
    r.offset = static_cast<int64_t>(slot.value()) * slot_bytes;
    r.buffer = {Staging(staging_index), static_cast<size_t>(slot_bytes)};
    r.registered_index = staging_registered ? staging_index : -1;
    return r;
  }

  // Writes `src` with its header into staging buffer `index`: the request that stores it.
  internal::IoRequest PrepareWrite(SlotId slot, const BlockKey& key,
                                   absl::Span<const std::byte> src, int index, Completion done) {
    contents->Invalidate(slot);  // not-written from the moment the write starts
    uint8_t* buf = Staging(index);
    std::memcpy(buf + kHeaderBytes, src.data(), src.size());
    std::memset(buf + kHeaderBytes + src.size(), 0,
                static_cast<size_t>(slot_bytes - kHeaderBytes) - src.size());
    Header h;
    h.magic = kMagic;
    h.version = kFormatVersion;
    h.header_bytes = kHeaderBytes;
    h.key = key;
    h.payload_bytes = src.size();
    h.payload_checksum = XXH3_64bits(buf + kHeaderBytes, src.size());
    h.write_sequence = write_sequence.fetch_add(1);
    EncodeHeader(h, buf);

    internal::IoRequest r = Request(/*write=*/true, slot, index);
    r.done = [this, slot, key, index, done](int64_t result) {
      absl::Status status;
      if (result == slot_bytes) {
        contents->Set(slot, key);
      } else {
        // Short or failed: the slot stays not-written (a torn slot also fails its checksum).
        status = FromErrno(static_cast<int>(-result),
                           absl::StrCat(info.name, ": writing slot ", slot.value()));
      }
      ReleaseStaging(index);  // the kernel is done with it: the CQE has arrived
      done.Complete(std::move(status));
    };
    return r;
  }

  // The request that reads `slot` into staging buffer `index` and, if it holds `key` intact,
  // copies it to `dst`; nullopt (with `done` completed) if the slot no longer holds `key`.
  std::optional<internal::IoRequest> PrepareRead(SlotId slot, const BlockKey& key,
                                                 absl::Span<std::byte> dst, int index,
                                                 Completion done) {
    if (absl::Status s = contents->Check(slot, key, info); !s.ok()) {
      done.Complete(std::move(s));
      return std::nullopt;
    }
    internal::IoRequest r = Request(/*write=*/false, slot, index);
    r.done = [this, slot, key, dst, index, done](int64_t result) {
      absl::Status status;
      const uint8_t* buf = Staging(index);
      if (result != slot_bytes) {
        status = FromErrno(static_cast<int>(-result),
                           absl::StrCat(info.name, ": reading slot ", slot.value()));
      } else {
        Header h;
        std::string why;
        if (!DecodeHeader(buf, info.block_bytes, &h, &why)) {
          // `why` says what is wrong with the header
        } else if (h.key != key) {
          why = absl::StrCat("holds block ", h.key.ToHex(), ", not ", key.ToHex());
        } else if (XXH3_64bits(buf + kHeaderBytes, dst.size()) != h.payload_checksum) {
          why = "payload checksum mismatch (torn or corrupt block)";
        }
        if (why.empty()) {
          std::memcpy(dst.data(), buf + kHeaderBytes, dst.size());
        } else if (contents->InvalidateIfHolds(slot, key)) {
          corrupt_reads.fetch_add(1);  // a corrupt slot is a miss from now on
          status = absl::DataLossError(
              absl::StrCat(info.name, ": slot ", slot.value(), " is corrupt: ", why));
        } else {
          // A write replaced the block while this read ran: not corruption, and the new block
          // the slot records stays readable.
          status = absl::DataLossError(absl::StrCat(info.name, ": slot ", slot.value(),
                                                    " was rewritten during the read: ", why));
        }
      }
      ReleaseStaging(index);
      done.Complete(std::move(status));
    };
    return r;
  }
};

int64_t NvmeTier::SlotBytes(const KvGeometry& geometry) {
  return (kHeaderBytes + geometry.bytes_per_block() + kAlignment - 1) / kAlignment * kAlignment;
}

absl::StatusOr<std::unique_ptr<NvmeTier>> NvmeTier::Create(const KvGeometry& geometry,
                                                           const NvmeTierOptions& options) {
  if (options.path.empty()) return absl::InvalidArgumentError("NvmeTier: the path is empty");
  const int64_t slot_bytes = SlotBytes(geometry);
  const int64_t blocks = options.capacity_bytes > 0 ? options.capacity_bytes / slot_bytes : 0;
  if (blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("NvmeTier: capacity_bytes = ",
                                                   options.capacity_bytes,
                                                   " holds no slot of ", slot_bytes, " bytes"));
  }
  // Before the file is preallocated and every header read: a budget the allocator refuses
  // would otherwise fail only after terabytes of both.
  if (blocks > BlockAllocator::kMaxCapacityBlocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NvmeTier: capacity_bytes = ", options.capacity_bytes, " is ", blocks, " slots of ",
        slot_bytes, " bytes, more than ", BlockAllocator::kMaxCapacityBlocks, " (BlockAllocator)"));
  }
  if (options.queue_depth < 1 || options.queue_depth > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("NvmeTier: queue_depth = ", options.queue_depth,
                                                   " is outside [1, 4096]"));
  }
  if (options.thread_pool_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NvmeTier: thread_pool_threads = ", options.thread_pool_threads, " must be >= 1"));
  }
  KVTIER_ASSIGN_OR_RETURN(
      internal::HostRegion staging,
      internal::HostRegion::Create(static_cast<size_t>(options.queue_depth * slot_bytes),
                                   "NvmeTier staging", /*try_huge_pages=*/false));
  auto impl = std::make_unique<Impl>(geometry, std::move(staging));
  impl->slot_bytes = slot_bytes;
  impl->staging_count = options.queue_depth;
  {
    // Not shared yet; the lock is for the thread-safety analysis.
    internal::MutexLock lock(&impl->staging_mu);
    for (int i = options.queue_depth - 1; i >= 0; --i) impl->free_staging.push_back(i);
  }

  const int64_t file_bytes = blocks * slot_bytes;
  impl->fd = open(options.path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  if (impl->fd < 0) {
    return absl::UnavailableError(absl::StrCat("NvmeTier: cannot open ", options.path,
                                               " with O_DIRECT: ", std::strerror(errno)));
  }
  struct stat st {};
  fstat(impl->fd, &st);
  if (S_ISBLK(st.st_mode)) {
    uint64_t device_bytes = 0;
    ioctl(impl->fd, BLKGETSIZE64, &device_bytes);
    if (static_cast<int64_t>(device_bytes) < file_bytes) {
      return absl::UnavailableError(absl::StrCat("NvmeTier: ", options.path, " has ",
                                                 device_bytes, " bytes; the tier needs ",
                                                 file_bytes));
    }
  } else if (st.st_size < file_bytes) {
    // Reserve the space now so a full file system fails here, clearly, not on a later write.
    if (int r = posix_fallocate(impl->fd, 0, file_bytes); r != 0) {
      return FromErrno(r, absl::StrCat("NvmeTier: preallocating ", file_bytes, " bytes of ",
                                       options.path));
    }
  }

  // Warm restart: every slot whose header is valid holds a block (its payload checksum is
  // checked when it is read).
  impl->contents = std::make_unique<internal::SlotContents>(blocks);
  std::vector<SlotId> cached;
  {
    uint8_t* header = impl->Staging(0);
    for (int64_t i = 0; i < blocks; ++i) {
      const ssize_t n = pread(impl->fd, header, kHeaderBytes, i * slot_bytes);
      if (n != kHeaderBytes) continue;
      Header h;
      std::string why;
      if (!DecodeHeader(header, geometry.bytes_per_block(), &h, &why)) continue;
      const SlotId slot(static_cast<uint32_t>(i));
      impl->recovered.push_back({slot, h.key, h.write_sequence});
      impl->contents->Set(slot, h.key);
      cached.push_back(slot);
      if (h.write_sequence >= impl->write_sequence) impl->write_sequence = h.write_sequence + 1;
    }
  }
  KVTIER_ASSIGN_OR_RETURN(impl->allocator,
                          BlockAllocator::CreateWithCached(Tier::kNvme, blocks, cached));

  if (options.engine != NvmeEngine::kThreadPool) {
    std::vector<struct iovec> buffers;
    for (int i = 0; i < impl->staging_count; ++i) {
      buffers.push_back({impl->Staging(i), static_cast<size_t>(slot_bytes)});
    }
    absl::StatusOr<std::unique_ptr<internal::IoEngine>> uring =
        internal::CreateUringEngine(impl->fd, options.queue_depth, buffers);
    if (uring.ok()) {
      impl->engine = std::move(*uring);
      impl->staging_registered = true;
    } else if (options.engine == NvmeEngine::kIoUring) {
      return absl::UnavailableError(absl::StrCat("NvmeTier: ", uring.status().message()));
    }
  }
  if (impl->engine == nullptr) {
    KVTIER_ASSIGN_OR_RETURN(impl->engine,
                            internal::CreateThreadPoolEngine(impl->fd, options.thread_pool_threads));
  }

  TierInfo& info = impl->info;
  info.tier = Tier::kNvme;
  info.name = absl::StrCat("nvme(", impl->engine->name(), ")");
  info.capacity_blocks = blocks;
  info.block_bytes = geometry.bytes_per_block();
  info.capacity_bytes = blocks * info.block_bytes;
  info.metadata_bytes = blocks * (slot_bytes - info.block_bytes + 8 +
                                  internal::SlotContents::kBytesPerSlot);
  info.capabilities = kCapPersistent | kCapChecksummed;
  return std::unique_ptr<NvmeTier>(new NvmeTier(std::move(impl)));
}

NvmeTier::NvmeTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NvmeTier::~NvmeTier() = default;

const TierInfo& NvmeTier::info() const { return impl_->info; }
BlockAllocator& NvmeTier::allocator() { return *impl_->allocator; }
const char* NvmeTier::engine_name() const { return impl_->engine->name(); }
const std::vector<RecoveredBlock>& NvmeTier::recovered() const { return impl_->recovered; }
int64_t NvmeTier::corrupt_reads() const { return impl_->corrupt_reads.load(); }
int NvmeTier::staging_buffers() const { return impl_->staging_count; }
int NvmeTier::free_staging_buffers() const {
  internal::MutexLock lock(&impl_->staging_mu);
  return static_cast<int>(impl_->free_staging.size());
}
void NvmeTier::InjectSubmitFailureForTest(int err) { impl_->engine->InjectSubmitFailure(err); }
void NvmeTier::HoldCompletionsForTest(bool hold) { impl_->engine->HoldCompletionsForTest(hold); }

Completion NvmeTier::WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                                const BlockIoOptions& options) {
  const BlockWrite one{slot, key, src};
  return WriteBlocks({&one, 1}, options)[0];
}

Completion NvmeTier::ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                               const BlockIoOptions& options) {
  const BlockRead one{slot, key, dst};
  return ReadBlocks({&one, 1}, options)[0];
}

std::vector<Completion> NvmeTier::WriteBlocks(absl::Span<const BlockWrite> writes,
                                              const BlockIoOptions& options) {
  Impl* impl = impl_.get();
  std::vector<Completion> out;
  out.reserve(writes.size());
  std::vector<internal::IoRequest> batch;  // the requests that found a buffer: one submission
  for (const BlockWrite& w : writes) {
    if (absl::Status s =
            internal::CheckBlockIoNow(impl->info, w.slot, w.src.size(), options.deadline);
        !s.ok()) {
      out.push_back(Completion::Done(std::move(s)));
      continue;
    }
    Completion done;
    impl->StartOrQueue(
        w.slot, options.deadline, done,
        [impl, slot = w.slot, key = w.key, src = w.src, done](int index) {
          return std::optional<internal::IoRequest>(
              impl->PrepareWrite(slot, key, src, index, done));
        },
        batch);
    out.push_back(std::move(done));
  }
  if (!batch.empty()) impl->engine->Submit(std::move(batch));
  return out;
}

std::vector<Completion> NvmeTier::ReadBlocks(absl::Span<const BlockRead> reads,
                                             const BlockIoOptions& options) {
  Impl* impl = impl_.get();
  std::vector<Completion> out;
  out.reserve(reads.size());
  std::vector<internal::IoRequest> batch;
  for (const BlockRead& rd : reads) {
    if (absl::Status s = internal::CheckBlockIo(impl->info, rd.slot, rd.dst.size()); !s.ok()) {
      out.push_back(Completion::Done(std::move(s)));
      continue;
    }
    if (absl::Status s = impl->contents->Check(rd.slot, rd.key, impl->info); !s.ok()) {
      out.push_back(Completion::Done(std::move(s)));
      continue;
    }
    if (absl::Now() > options.deadline) {
      out.push_back(Completion::Done(internal::DeadlinePassed(impl->info, rd.slot)));
      continue;
    }
    Completion done;
    impl->StartOrQueue(
        rd.slot, options.deadline, done,
        [impl, slot = rd.slot, key = rd.key, dst = rd.dst, done](int index) {
          return impl->PrepareRead(slot, key, dst, index, done);
        },
        batch);
    out.push_back(std::move(done));
  }
  if (!batch.empty()) impl->engine->Submit(std::move(batch));
  return out;
}

}  // namespace kvtier
