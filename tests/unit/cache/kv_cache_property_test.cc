// Random operations against KvCache with a fixed seed, checked against a model of what every
// sequence holds and against the cache's own invariants after every step: CheckInvariants, the
// per-tier accounting of the stats, the contiguity and consistency of the event stream, and the
// documented error codes (an error is allowed only where kv_cache.h says it can happen). A small
// HBM over DRAM and NVMe keeps eviction, demotion and onboarding busy.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtier/kv_cache.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::KvCacheEnv;
using ::kvtier::testing::StatsString;

constexpr int kB = KvCacheEnv::kTokensPerBlock;
constexpr int64_t kHbmBlocks = 24;
constexpr int64_t kDramBlocks = 24;
constexpr int64_t kNvmeBlocks = 48;
constexpr size_t kMaxLive = 6;
constexpr size_t kMaxTickets = 8;
constexpr size_t kMaxTokens = 40;  // per sequence: 10 blocks; a few live ones fill HBM

// Steps per run; KVTIER_PROPERTY_STEPS overrides (e.g. more for a long soak).
int Steps() {
  if (const char* env = std::getenv("KVTIER_PROPERTY_STEPS"); env != nullptr) {
    return std::max(1, std::atoi(env));
  }
  return 3000;
}

struct SeqModel {
  std::vector<int32_t> tokens;    // what the cache must report
  std::vector<int32_t> intended;  // the stream Append follows (a shared prompt, then its own)
  int64_t written = 0;
  bool paused = false;
  bool salted = false;
};

struct OpenTicket {
  ResidencyTicket ticket;
  ResidencyMode mode;
};

class Driver {
 public:
  Driver(KvCache* cache, KvCacheEnv* env, uint64_t seed)
      : cache_(cache), env_(env), rng_(seed), next_token_(1 << 20) {
    const std::vector<int32_t> a = testing::Iota(40, 10000);
    const std::vector<int32_t> b = testing::Iota(24, 20000);
    for (size_t n : {8, 20, 33, 40}) prompts_.emplace_back(a.begin(), a.begin() + n);
    for (size_t n : {12, 24}) prompts_.emplace_back(b.begin(), b.begin() + n);
  }

  // One random operation and the checks after it. False once a check failed.
  bool Step(int step) {
    step_ = step;
    env_->clock().Advance(absl::Microseconds(Uniform(0, 200)));
    const int op = static_cast<int>(Uniform(0, 99));
    if (op < 12) {
      CreateAndAttach();
    } else if (op < 30) {
      Append();
    } else if (op < 44) {
      ReportWritten();
    } else if (op < 56) {
      if (tickets_.size() >= kMaxTickets) {
        ReleaseTicket();
      } else {
        EnsureResident();
      }
    } else if (op < 68) {
      ReleaseTicket();
    } else if (op < 72) {
      Fork();
    } else if (op < 76) {
      Pause();
    } else if (op < 80) {
      Resume();
    } else if (op < 89) {
      Release();
    } else if (op < 92) {
      Prefetch();
    } else if (op < 94) {
      Lookup();
    } else if (op < 97) {
      Probe();
    } else if (op < 99) {
      FireSomeReadies();
    } else {
      Quiesce();
    }
    CheckAfterStep();
    return !::testing::Test::HasFailure();
  }

  // Releases everything, waits, and checks that nothing is held, locked or open.
  void Finish() {
    FireAllReadies();
    for (OpenTicket& t : tickets_) {
      Expect(cache_->ReleaseTicket(t.ticket), {}, "final ReleaseTicket");
    }
    tickets_.clear();
    std::vector<uint64_t> ids;
    for (const auto& [id, unused] : live_) ids.push_back(id);
    for (uint64_t id : ids) Expect(cache_->Release(SequenceId(id)), {}, "final Release");
    live_.clear();
    KVTIER_EXPECT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(60)));
    KVTIER_EXPECT_OK(cache_->CheckInvariants());
    PollAndCheckEvents();
    const KvCacheStats s = cache_->stats();
    testing::ExpectAllReleased(s);
    EXPECT_EQ(s.indexed_blocks, IndexedFromEvents()) << StatsString(s);
  }

  // What the run exercised, so a change that makes it trivial shows.
  std::string Summary() const {
    const KvCacheStats s = cache_->stats();
    std::string out = absl::StrCat("attached ", attached_tokens_, " tokens, ", exhausted_,
                                   " appends found HBM full, ", last_event_, " events");
    for (int i = 0; i < kNumTiers; ++i) {
      const KvTierStats& t = s.tiers[static_cast<size_t>(i)];
      if (!t.present) continue;
      absl::StrAppend(&out, "; ", std::string(TierName(static_cast<Tier>(i))), ": hits ", t.hits,
                      " stored ", t.stored, " evictions ", t.evictions, " demotions ", t.demotions);
    }
    return out;
  }

 private:
  // ---- randomness

  int64_t Uniform(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool Chance(int percent) { return Uniform(0, 99) < percent; }
  int32_t FreshToken() { return next_token_++; }

  std::optional<uint64_t> PickLive(bool want_unpaused = false) {
    std::vector<uint64_t> ids;
    for (const auto& [id, m] : live_) {
      if (!want_unpaused || !m.paused) ids.push_back(id);
    }
    if (ids.empty()) return std::nullopt;
    return ids[static_cast<size_t>(Uniform(0, static_cast<int64_t>(ids.size()) - 1))];
  }

  std::vector<int32_t> RandomPrompt() {
    std::vector<int32_t> p =
        prompts_[static_cast<size_t>(Uniform(0, static_cast<int64_t>(prompts_.size()) - 1))];
    const int64_t suffix = Uniform(0, 12);
    for (int64_t i = 0; i < suffix; ++i) p.push_back(FreshToken());
    return p;
  }

  SequenceOptions Identity(bool salted) const {
    SequenceOptions o;
    if (salted) o.tenant_salt = "tenant-b";
    return o;
  }

  // ---- status checks

  std::string Where(const char* what) const { return absl::StrCat("step ", step_, ": ", what); }

  // OK, or one of `allowed`; anything else fails the test. Returns the status's code.
  StatusCode Expect(const absl::Status& s, std::initializer_list<StatusCode> allowed,
                    const char* what) {
    if (s.ok()) return StatusCode::kOk;
    if (std::find(allowed.begin(), allowed.end(), s.code()) == allowed.end()) {
      ADD_FAILURE() << Where(what) << ": undocumented error " << s;
    }
    return s.code();
  }
  void ExpectCode(const absl::Status& s, StatusCode code, const char* what) {
    if (s.code() != code) {
      ADD_FAILURE() << Where(what) << ": want " << absl::StatusCodeToString(code) << ", got " << s;
    }
  }

  // The cache's view of `id` equals the model's.
  void CheckSequence(uint64_t id) {
    auto it = live_.find(id);
    if (it == live_.end()) return;
    const SeqModel& m = it->second;
    auto info = cache_->GetSequence(SequenceId(id));
    if (!info.ok()) {
      ADD_FAILURE() << Where("GetSequence") << ": " << info.status();
      return;
    }
    const int64_t n = static_cast<int64_t>(m.tokens.size());
    EXPECT_EQ(info->num_tokens, n) << Where("num_tokens") << " of " << id;
    EXPECT_EQ(info->written_tokens, m.written) << Where("written_tokens") << " of " << id;
    EXPECT_EQ(info->num_blocks, (n + kB - 1) / kB) << Where("num_blocks") << " of " << id;
    EXPECT_EQ(info->paused, m.paused) << Where("paused") << " of " << id;
    int64_t by_tier = 0;
    for (int64_t b : info->blocks_by_tier) {
      EXPECT_GE(b, 0);
      by_tier += b;
    }
    EXPECT_EQ(by_tier, info->num_blocks) << Where("blocks_by_tier") << " of " << id;
  }

  // ---- operations

  void CreateAndAttach() {
    if (live_.size() >= kMaxLive) {
      Release();
      return;
    }
    const uint64_t id = next_id_++;
    SeqModel m;
    m.salted = Chance(20);
    SequenceOptions options = Identity(m.salted);
    options.retention_priority = static_cast<double>(Uniform(0, 3));
    options.retention = absl::Milliseconds(Uniform(0, 50));
    Expect(cache_->CreateSequence(SequenceId(id), options), {}, "CreateSequence");
    m.intended = RandomPrompt();
    if (Chance(85)) {
      auto r = cache_->AttachPrefix(SequenceId(id), m.intended);
      Expect(r.status(), {}, "AttachPrefix");
      if (r.ok()) {
        const int64_t size = static_cast<int64_t>(m.intended.size());
        EXPECT_EQ(r->matched_tokens % kB, 0) << Where("matched");
        EXPECT_EQ(r->attached_tokens % kB, 0) << Where("attached");
        EXPECT_LE(r->attached_tokens, r->matched_tokens) << Where("attached");
        EXPECT_LE(r->matched_tokens, size) << Where("matched");
        EXPECT_LT(r->attached_tokens, size) << Where("the last token is computed");
        EXPECT_EQ(r->plan.restore_blocks * kB, r->attached_tokens) << Where("plan");
        int64_t blocks = 0;
        for (int64_t b : r->attached_blocks_by_tier) blocks += b;
        EXPECT_EQ(blocks * kB, r->attached_tokens) << Where("attached_blocks_by_tier");
        m.tokens.assign(m.intended.begin(), m.intended.begin() + r->attached_tokens);
        m.written = r->attached_tokens;
        attached_tokens_ += r->attached_tokens;
      }
    }
    live_[id] = std::move(m);
    CheckSequence(id);
  }

  void Append() {
    auto id = PickLive();
    if (!id) return;
    SeqModel& m = live_[*id];
    if (m.tokens.size() >= kMaxTokens) return;
    const size_t n =
        std::min<size_t>(static_cast<size_t>(Uniform(1, 9)), kMaxTokens - m.tokens.size());
    std::vector<int32_t> add;
    for (size_t i = 0; i < n; ++i) {
      const size_t at = m.tokens.size() + i;
      add.push_back(at < m.intended.size() ? m.intended[at] : FreshToken());
    }
    const int64_t before = static_cast<int64_t>(m.tokens.size());
    auto r = cache_->Append(SequenceId(*id), add);
    const StatusCode code =
        m.paused
            ? Expect(r.status(), {StatusCode::kResourceExhausted, StatusCode::kFailedPrecondition},
                     "Append (paused)")
            : Expect(r.status(), {StatusCode::kResourceExhausted}, "Append");
    if (code == StatusCode::kResourceExhausted) ++exhausted_;
    if (r.ok()) {
      const int64_t after = before + static_cast<int64_t>(n);
      EXPECT_EQ(r->first_sealed_block, before / kB) << Where("first_sealed_block");
      EXPECT_EQ(r->num_sealed_blocks, after / kB - before / kB) << Where("num_sealed_blocks");
      EXPECT_EQ(r->num_new_slots, (after + kB - 1) / kB - (before + kB - 1) / kB)
          << Where("num_new_slots");
      m.tokens.insert(m.tokens.end(), add.begin(), add.end());
      if (m.intended.size() < m.tokens.size()) m.intended = m.tokens;
    }
    CheckSequence(*id);
  }

  void ReportWritten() {
    auto id = PickLive();
    if (!id) return;
    SeqModel& m = live_[*id];
    const int64_t n = Uniform(m.written, static_cast<int64_t>(m.tokens.size()));
    Completion ready = Completion::Done(absl::OkStatus());
    if (Chance(30)) {
      ready = Completion();
      pending_readies_.push_back(ready);
    }
    const absl::Status s = cache_->ReportWritten(SequenceId(*id), n, ready);
    if (m.paused) {
      Expect(s, {StatusCode::kFailedPrecondition}, "ReportWritten (paused)");
    } else {
      Expect(s, {}, "ReportWritten");
    }
    if (s.ok()) m.written = n;
    CheckSequence(*id);
  }

  void EnsureResident() {
    auto id = PickLive();
    if (!id) return;
    const SeqModel& m = live_[*id];
    const int64_t size = static_cast<int64_t>(m.tokens.size());
    const int64_t end = Chance(70) ? size : Uniform(0, size);
    const int64_t begin = Chance(60) ? 0 : Uniform(0, end);
    const auto mode = static_cast<ResidencyMode>(Uniform(0, 2));
    const EnsureResidentOptions options{.deadline = absl::Now() + absl::Seconds(10), .mode = mode};
    auto t = cache_->EnsureResident(SequenceId(*id), begin, end, options);
    if (m.paused) {
      Expect(t.status(), {StatusCode::kFailedPrecondition, StatusCode::kResourceExhausted},
             "EnsureResident (paused)");
    } else {
      // kv_cache.h's general "kResourceExhausted when HBM is full of locked and held blocks".
      Expect(t.status(), {StatusCode::kResourceExhausted}, "EnsureResident");
    }
    if (!t.ok()) return;
    const int64_t first = begin / kB;
    // Blocks [begin / B, ceil(end / B)); an empty token range reads no block (the literal
    // formula would give the block holding `begin` when begin is not a block boundary).
    const int64_t expected_blocks = begin == end ? 0 : (end + kB - 1) / kB - first;
    EXPECT_EQ(t->begin_token(), begin);
    EXPECT_EQ(t->end_token(), end);
    EXPECT_EQ(t->sequence(), SequenceId(*id));
    EXPECT_EQ(static_cast<int64_t>(t->block_table().slots.size()), expected_blocks)
        << Where("slots") << " [" << begin << ", " << end << ")";
    if (expected_blocks > 0) {
      EXPECT_EQ(t->block_table().first_block, first) << Where("first_block");
    }
    EXPECT_EQ(t->block_table().tokens_per_block, kB);
    if (mode != ResidencyMode::kAsync) CheckFinalTicket(*t, "EnsureResident");
    tickets_.push_back({*t, mode});
  }

  // A ticket whose statuses are final: no kPending; slots valid and distinct for resident
  // blocks, -1 with a cause for the others; resident_tokens the leading resident run.
  void CheckFinalTicket(const ResidencyTicket& t, const char* what) {
    const std::vector<BlockResidency> status = t.block_status();
    const DeviceBlockTable& table = t.block_table();
    if (status.size() != table.slots.size()) {
      ADD_FAILURE() << Where(what) << ": " << status.size() << " statuses, " << table.slots.size()
                    << " slots";
      return;
    }
    std::set<int32_t> seen;
    int64_t leading = 0;
    bool run = true;
    for (size_t i = 0; i < status.size(); ++i) {
      const int32_t slot = table.slots[i];
      if (status[i] == BlockResidency::kResident) {
        EXPECT_GE(slot, 0) << Where(what) << " block " << i;
        EXPECT_LT(slot, kHbmBlocks) << Where(what) << " block " << i;
        EXPECT_TRUE(seen.insert(slot).second) << Where(what) << ": slot " << slot << " twice";
        KVTIER_EXPECT_OK(t.block_error(static_cast<int64_t>(i))) << Where(what);
        if (run) ++leading;
      } else {
        EXPECT_EQ(status[i], BlockResidency::kNotResident) << Where(what) << " block " << i;
        EXPECT_EQ(slot, -1) << Where(what) << " block " << i;
        EXPECT_FALSE(t.block_error(static_cast<int64_t>(i)).ok()) << Where(what);
        run = false;
      }
    }
    const int64_t begin = t.begin_token();
    const int64_t end = t.end_token();
    const int64_t covered = leading == static_cast<int64_t>(status.size())
                                ? end - begin
                                : std::max<int64_t>(0, (table.first_block + leading) * kB - begin);
    EXPECT_EQ(t.resident_tokens(), covered) << Where(what) << " [" << begin << ", " << end << ")";
    if (t.completion().done()) {
      EXPECT_EQ(t.completion().status().ok(), leading == static_cast<int64_t>(status.size()))
          << Where(what) << ": completion " << t.completion().status();
    }
  }

  void ReleaseTicket() {
    if (tickets_.empty()) return;
    const size_t i = static_cast<size_t>(Uniform(0, static_cast<int64_t>(tickets_.size()) - 1));
    const OpenTicket t = tickets_[i];
    tickets_.erase(tickets_.begin() + static_cast<std::ptrdiff_t>(i));
    if (t.mode == ResidencyMode::kAsync && t.ticket.completion().done()) {
      CheckFinalTicket(t.ticket, "async ticket");
    }
    Expect(cache_->ReleaseTicket(t.ticket), {}, "ReleaseTicket");
    if (Chance(20)) {
      ExpectCode(cache_->ReleaseTicket(t.ticket), StatusCode::kFailedPrecondition,
                 "ReleaseTicket twice");
    }
  }

  void Fork() {
    auto parent = PickLive();
    if (!parent || live_.size() >= kMaxLive) return;
    const SeqModel& p = live_[*parent];
    const int64_t size = static_cast<int64_t>(p.tokens.size());
    const int64_t n = Uniform(0, size);
    const uint64_t child = next_id_++;
    auto r = cache_->Fork(SequenceId(*parent), SequenceId(child), n);
    Expect(r.status(), {StatusCode::kResourceExhausted, StatusCode::kFailedPrecondition}, "Fork");
    if (!r.ok()) {
      ExpectCode(cache_->GetSequence(SequenceId(child)).status(), StatusCode::kNotFound,
                 "failed Fork made a child");
      return;
    }
    EXPECT_EQ(r->has_value(), n % kB != 0) << Where("Fork copy") << " at " << n;
    if (r->has_value()) {
      EXPECT_EQ((*r)->num_tokens, n % kB) << Where("Fork copy");
      EXPECT_NE((*r)->src, (*r)->dst) << Where("Fork copy");
    }
    SeqModel c;
    c.tokens.assign(p.tokens.begin(), p.tokens.begin() + n);
    c.intended = c.tokens;
    c.salted = p.salted;
    auto info = cache_->GetSequence(SequenceId(child));
    KVTIER_EXPECT_OK(info.status()) << Where("GetSequence of a fork");
    if (info.ok()) {
      EXPECT_LE(info->written_tokens, std::min(n, p.written)) << Where("fork written");
      EXPECT_GE(info->written_tokens, 0);
      c.written = info->written_tokens;
    }
    live_[child] = std::move(c);
    CheckSequence(child);
    CheckSequence(*parent);
  }

  void Pause() {
    auto id = PickLive();
    if (!id) return;
    SeqModel& m = live_[*id];
    const absl::Status s = cache_->Pause(SequenceId(*id), absl::Seconds(Uniform(0, 120)));
    if (m.paused) {
      ExpectCode(s, StatusCode::kFailedPrecondition, "Pause while paused");
    } else {
      Expect(s, {}, "Pause");
      if (s.ok()) m.paused = true;
    }
    CheckSequence(*id);
  }

  void Resume() {
    auto id = PickLive();
    if (!id) return;
    SeqModel& m = live_[*id];
    auto c = cache_->Resume(SequenceId(*id));
    if (!m.paused) {
      ExpectCode(c.status(), StatusCode::kFailedPrecondition, "Resume while not paused");
    } else {
      Expect(c.status(), {}, "Resume");
      if (c.ok()) {
        m.paused = false;
        resumes_.push_back(*c);
      }
    }
    CheckSequence(*id);
  }

  void Release() {
    auto id = PickLive();
    if (!id) return;
    Expect(cache_->Release(SequenceId(*id)), {}, "Release");
    live_.erase(*id);
    released_.push_back(*id);
    if (Chance(20)) {
      ExpectCode(cache_->Release(SequenceId(*id)), StatusCode::kFailedPrecondition,
                 "Release twice");
    }
  }

  void Prefetch() {
    const bool salted = Chance(20);
    const std::vector<int32_t> p = RandomPrompt();
    auto r = cache_->Prefetch(p, Identity(salted));
    Expect(r.status(), {}, "Prefetch");
    if (r.ok()) {
      EXPECT_GE(*r, 0);
      EXPECT_LE(*r, static_cast<int64_t>(p.size()) / kB) << Where("Prefetch");
    }
  }

  void Lookup() {
    const std::vector<int32_t> p = RandomPrompt();
    auto r = cache_->Lookup(p, Identity(Chance(20)));
    Expect(r.status(), {}, "Lookup");
    if (!r.ok()) return;
    EXPECT_EQ(r->matched_tokens % kB, 0) << Where("Lookup");
    EXPECT_LE(r->matched_tokens, static_cast<int64_t>(p.size())) << Where("Lookup");
    int64_t blocks = 0;
    for (int64_t b : r->blocks_by_tier) blocks += b;
    EXPECT_EQ(blocks * kB, r->matched_tokens) << Where("Lookup blocks_by_tier");
  }

  // Calls that must fail with a documented code and change nothing. Paused sequences are left
  // out: which of two applicable errors comes first is not documented.
  void Probe() {
    const int which = static_cast<int>(Uniform(0, 7));
    const SequenceId unknown(999999999);
    switch (which) {
      case 0:
        ExpectCode(cache_->Append(unknown, {1}).status(), StatusCode::kNotFound, "unknown");
        ExpectCode(cache_->EnsureResident(unknown, 0, 0).status(), StatusCode::kNotFound,
                   "unknown");
        return;
      case 1:
        if (released_.empty()) return;
        {
          const SequenceId r(released_[static_cast<size_t>(
              Uniform(0, static_cast<int64_t>(released_.size()) - 1))]);
          if (live_.contains(r.value())) return;
          ExpectCode(cache_->Append(r, {1}).status(), StatusCode::kFailedPrecondition,
                     "released Append");
          ExpectCode(cache_->GetSequence(r).status(), StatusCode::kFailedPrecondition,
                     "released GetSequence");
          ExpectCode(cache_->Pause(r, absl::Seconds(1)), StatusCode::kFailedPrecondition,
                     "released Pause");
        }
        return;
      default:
        break;
    }
    auto id = PickLive(/*want_unpaused=*/true);
    if (!id) return;
    const SeqModel& m = live_[*id];
    const SequenceId s(*id);
    const int64_t size = static_cast<int64_t>(m.tokens.size());
    switch (which) {
      case 2:
        ExpectCode(cache_->ReportWritten(s, size + 1), StatusCode::kOutOfRange,
                   "ReportWritten past the end");
        if (m.written > 0) {
          ExpectCode(cache_->ReportWritten(s, m.written - 1), StatusCode::kInvalidArgument,
                     "ReportWritten backwards");
        }
        break;
      case 3:
        ExpectCode(cache_->EnsureResident(s, 0, size + 1).status(), StatusCode::kOutOfRange,
                   "EnsureResident past the end");
        if (size > 0) {
          ExpectCode(cache_->EnsureResident(s, size, size - 1).status(),
                     StatusCode::kInvalidArgument, "EnsureResident begin > end");
        }
        ExpectCode(cache_->EnsureResident(s, 0, size, {.deadline = absl::InfinitePast()}).status(),
                   StatusCode::kDeadlineExceeded, "EnsureResident past deadline");
        break;
      case 4:
        ExpectCode(cache_->Append(s, {}).status(), StatusCode::kInvalidArgument, "empty Append");
        break;
      case 5:
        if (size > 0) {
          ExpectCode(cache_->AttachPrefix(s, m.intended).status(), StatusCode::kFailedPrecondition,
                     "AttachPrefix on a non-empty sequence");
        }
        break;
      case 6:
        ExpectCode(cache_->CreateSequence(s), StatusCode::kAlreadyExists, "CreateSequence twice");
        break;
      default:
        ExpectCode(cache_->Fork(s, SequenceId(next_id_), size + 1).status(),
                   StatusCode::kOutOfRange, "Fork past the end");
        break;
    }
    CheckSequence(*id);
  }

  void FireSomeReadies() {
    std::vector<Completion> keep;
    for (Completion& c : pending_readies_) {
      if (Chance(60)) {
        c.Complete(absl::OkStatus());
      } else {
        keep.push_back(c);
      }
    }
    pending_readies_ = std::move(keep);
  }
  void FireAllReadies() {
    for (Completion& c : pending_readies_) c.Complete(absl::OkStatus());
    pending_readies_.clear();
  }

  // Lets everything land, then checks what only holds at rest.
  void Quiesce() {
    FireAllReadies();
    for (const OpenTicket& t : tickets_) {
      if (t.mode != ResidencyMode::kAsync) continue;
      const absl::Status s = t.ticket.completion().WaitFor(absl::Seconds(30));
      ASSERT_NE(s.code(), StatusCode::kDeadlineExceeded)
          << Where("async ticket never completed") << ": " << s;
      CheckFinalTicket(t.ticket, "async ticket");
    }
    for (const Completion& c : resumes_) {
      ASSERT_NE(c.WaitFor(absl::Seconds(30)).code(), StatusCode::kDeadlineExceeded)
          << Where("Resume never completed");
    }
    resumes_.clear();
    KVTIER_ASSERT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(60))) << Where("WaitIdle");
    PollAndCheckEvents();
    const KvCacheStats s = cache_->stats();
    for (int i = 0; i < kNumTiers; ++i) {
      const KvTierStats& t = s.tiers[static_cast<size_t>(i)];
      EXPECT_EQ(t.in_flight_blocks, 0) << Where("idle") << "\n" << StatsString(s);
      EXPECT_EQ(t.quarantined_blocks, 0) << Where("idle") << "\n" << StatsString(s);
    }
    // Locked HBM blocks are exactly the resident blocks of open tickets.
    std::set<int32_t> pinned;
    for (const OpenTicket& t : tickets_) {
      const std::vector<BlockResidency> status = t.ticket.block_status();
      for (size_t i = 0; i < status.size(); ++i) {
        if (status[i] == BlockResidency::kResident) pinned.insert(t.ticket.block_table().slots[i]);
      }
    }
    EXPECT_EQ(s.tiers[TierIndex(Tier::kHbm)].locked_blocks, static_cast<int64_t>(pinned.size()))
        << Where("locked") << "\n"
        << StatsString(s);
    EXPECT_EQ(s.indexed_blocks, IndexedFromEvents()) << Where("indexed") << "\n" << StatsString(s);
  }

  // ---- checks after every step

  void CheckAfterStep() {
    const absl::Status inv = cache_->CheckInvariants();
    EXPECT_TRUE(inv.ok()) << Where("CheckInvariants") << ": " << inv;
    const KvCacheStats s = cache_->stats();
    const std::string accounting = testing::TierAccountingError(s);
    EXPECT_EQ(accounting, "") << Where("accounting") << "\n" << StatsString(s);
    EXPECT_EQ(s.live_sequences, static_cast<int64_t>(live_.size())) << Where("live_sequences");
    EXPECT_EQ(s.open_tickets, static_cast<int64_t>(tickets_.size())) << Where("open_tickets");
    EXPECT_TRUE(s.tiers[TierIndex(Tier::kHbm)].present);
    EXPECT_TRUE(s.tiers[TierIndex(Tier::kDram)].present);
    EXPECT_TRUE(s.tiers[TierIndex(Tier::kNvme)].present);
    EXPECT_FALSE(s.tiers[TierIndex(Tier::kRemote)].present);
    PollAndCheckEvents();
  }

  // Events come numbered one by one, and a key's copy in a tier alternates stored / removed.
  void PollAndCheckEvents() {
    // Transfers land on other threads: read the counter first, every event up to it must come.
    const uint64_t announced = cache_->stats().last_event_sequence;
    for (;;) {
      const std::vector<CacheEvent> events = cache_->PollEvents(last_event_);
      if (events.empty()) break;
      for (const CacheEvent& e : events) {
        if (e.sequence != last_event_ + 1) {
          ADD_FAILURE() << Where("events") << ": got " << e.sequence << " after " << last_event_;
        }
        last_event_ = e.sequence;
        const int tier = TierIndex(e.tier);
        if (tier < 0 || tier >= kNumTiers) {
          ADD_FAILURE() << Where("event tier");
          continue;
        }
        uint8_t& tiers = copies_[e.key];
        const uint8_t bit = static_cast<uint8_t>(1u << tier);
        if (e.kind == CacheEventKind::kStored) {
          EXPECT_EQ(tiers & bit, 0) << Where("kStored twice") << " in " << TierName(e.tier)
                                    << " (event " << e.sequence << ")";
          tiers |= bit;
        } else {
          EXPECT_NE(tiers & bit, 0) << Where("kRemoved of no copy") << " in " << TierName(e.tier)
                                    << " (event " << e.sequence << ")";
          tiers &= static_cast<uint8_t>(~bit);
        }
        if (tiers == 0) copies_.erase(e.key);
      }
    }
    EXPECT_GE(last_event_, announced) << Where("last_event_sequence");
  }
  int64_t IndexedFromEvents() const { return static_cast<int64_t>(copies_.size()); }

  KvCache* cache_;
  KvCacheEnv* env_;
  std::mt19937_64 rng_;
  int32_t next_token_;
  uint64_t next_id_ = 1;
  int step_ = 0;
  std::vector<std::vector<int32_t>> prompts_;
  std::map<uint64_t, SeqModel> live_;  // ordered: the random choices must not depend on hashing
  std::vector<uint64_t> released_;
  std::vector<OpenTicket> tickets_;
  std::vector<Completion> pending_readies_;
  std::vector<Completion> resumes_;
  absl::flat_hash_map<BlockKey, uint8_t> copies_;  // tiers holding a stored copy, one bit each
  uint64_t last_event_ = 0;
  int64_t attached_tokens_ = 0;
  int64_t exhausted_ = 0;
};

using Param = std::tuple<std::string, WritePolicy, uint64_t>;

class KvCachePropertyTest : public ::testing::TestWithParam<Param> {};

TEST_P(KvCachePropertyTest, RandomOperationsKeepEveryInvariant) {
  // Plain copies, not structured bindings: clang 14 cannot capture those in a lambda.
  const std::string policy = std::get<0>(GetParam());
  const WritePolicy write = std::get<1>(GetParam());
  const uint64_t seed = std::get<2>(GetParam());
  KvCacheEnv env(
      {.hbm_blocks = kHbmBlocks, .dram_blocks = kDramBlocks, .nvme_blocks = kNvmeBlocks});
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> cache, env.NewCache([&](KvCacheOptions& o) {
    o.eviction_policy = policy;
    o.write_policy = write;
    o.inclusion = TierInclusion::kInclusive;
    o.room_wait = absl::Milliseconds(20);
    o.event_buffer = int64_t{1} << 20;
  }));
  Driver driver(cache.get(), &env, seed);
  const int steps = Steps();
  for (int step = 0; step < steps; ++step) {
    if (!driver.Step(step)) {
      ADD_FAILURE() << "stopped at step " << step << " of seed " << seed;
      break;
    }
  }
  driver.Finish();
  std::cout << "[ summary  ] " << driver.Summary() << "\n";
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const auto& [policy, write, seed] = info.param;
  return absl::StrCat(policy, write == WritePolicy::kWriteBack ? "_write_back" : "_write_through",
                      "_seed", seed);
}

INSTANTIATE_TEST_SUITE_P(Policies, KvCachePropertyTest,
                         ::testing::Combine(::testing::Values("lru", "cost_aware", "reuse_index"),
                                            ::testing::Values(WritePolicy::kWriteBack,
                                                              WritePolicy::kWriteThrough),
                                            ::testing::Values(uint64_t{1}, uint64_t{2})),
                         ParamName);

}  // namespace
}  // namespace kvtier
