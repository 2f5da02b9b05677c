// The C ABI's handles (what each opaque kvtier_* type of kvtier/c/kvtier.h is on the C++ side)
// and the boundary helpers every entry point uses: status to kvtier_error, null checks, token
// spans, timeouts, and the guard that keeps exceptions from crossing into C.
//
// Thread-safety: the handles add no state of their own beyond the C++ object they hold, so each
// has that object's thread-safety (KvCache, ResidencyTicket and Completion are thread-safe;
// CacheNamespace is immutable; a tier stack is used by one thread until a cache takes it).
#ifndef KVTIER_CAPI_HANDLES_H_
#define KVTIER_CAPI_HANDLES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtier/c/kvtier.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/completion.h"
#include "kvtier/kv_cache.h"
#include "kvtier/tier_stack.h"

struct kvtier_namespace {
  kvtier::CacheNamespace ns;
};

struct kvtier_tier_stack {
  kvtier::TierBackends tiers;
};

struct kvtier_cache {
  std::unique_ptr<kvtier::KvCache> cache;
};

struct kvtier_ticket {
  kvtier::ResidencyTicket ticket;
};

struct kvtier_completion {
  kvtier::Completion completion;
  // Made by kvtier_completion_create: the caller's to fire. The others (a ticket's, a layer's, a
  // resume's, a CUDA event's) the cache fires; a caller firing one would end a wait early.
  bool caller_fires = false;
};

namespace kvtier::capi {

// Writes `status` into `error` (if not null), the message cut to fit, and returns its code.
kvtier_status_code SetError(kvtier_error* error, const absl::Status& status);

// Runs `body` (returning absl::Status) and reports its outcome through `error`. An exception
// thrown inside becomes RESOURCE_EXHAUSTED (std::bad_alloc) or INTERNAL: none reaches C.
template <typename Body>
kvtier_status_code Guard(kvtier_error* error, Body&& body) {
  absl::Status status;
  try {
    status = std::forward<Body>(body)();
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("kvtier C ABI: out of memory");
  } catch (...) {
    status = absl::InternalError("kvtier C ABI: unexpected C++ exception");
  }
  return SetError(error, status);
}

// The integer a caller put in a C enum, read without loading the enum itself: C lets any int
// sit there, while in C++ a value outside the enumerators' range is undefined (UBSan's enum check
// aborts on the load). Every enum coming from C is read through this and range-checked.
template <typename E>
int RawEnum(const E& value) {
  static_assert(std::is_enum_v<E>);
  std::underlying_type_t<E> raw;
  std::memcpy(&raw, &value, sizeof(raw));
  return static_cast<int>(raw);
}

// kInvalidArgument "<call>: <what> is null".
absl::Status Null(const char* call, const char* what);

// The span of tokens[0, n); kInvalidArgument if tokens is null and n > 0.
absl::StatusOr<absl::Span<const int32_t>> Tokens(const char* call, const int32_t* tokens, size_t n);

// absl::Now() + timeout_ns, or absl::InfiniteFuture() for a negative timeout.
inline absl::Time DeadlineAfter(int64_t timeout_ns) {
  return timeout_ns < 0 ? absl::InfiniteFuture() : absl::Now() + absl::Nanoseconds(timeout_ns);
}

// C options to C++ ones (options.cc). Each checks the enum values it casts, kInvalidArgument
// naming the field otherwise.
absl::StatusOr<KvGeometryOptions> ToGeometryOptions(const kvtier_geometry_options& o);
absl::StatusOr<CacheNamespaceOptions> ToNamespaceOptions(const kvtier_namespace_options& o);
absl::StatusOr<TierStackOptions> ToTierStackOptions(const CacheNamespace& ns,
                                                    const kvtier_tier_stack_options& o);
// Everything but the tiers.
absl::StatusOr<KvCacheOptions> ToCacheOptions(const kvtier_cache_options& o);
// Null `o`: the defaults.
absl::StatusOr<SequenceOptions> ToSequenceOptions(const kvtier_sequence_options* o);

// Copies `text` into dst[0, capacity), NUL-terminated, cut to fit.
void CopyText(absl::string_view text, char* dst, size_t capacity);

// HintOutcome into its C form.
void ToHintOutcome(const HintOutcome& in, kvtier_hint_outcome* out);

}  // namespace kvtier::capi

#endif  // KVTIER_CAPI_HANDLES_H_
