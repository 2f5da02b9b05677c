// StringInterner: one copy per distinct string, so a std::string_view of it stays valid while
// the interner lives. For the few strings every cache event names (adapter ids, worker ids): an
// event then carries a 16-byte view instead of an allocation and copies freely. Each KvCache owns
// one (shared with its event hub, so a callback delivered late still reads valid views); nothing
// is process-wide.
//
// Cost: each distinct string is kept (with a hash-set node) until the interner goes; intern only
// strings drawn from a small set (an engine's loaded adapters, a worker's name), never
// per-request data. Thread-safe (one mutex; intern once per sequence or cache, not per event).
#ifndef KVTIER_INTERNAL_INTERNED_STRING_H_
#define KVTIER_INTERNAL_INTERNED_STRING_H_

#include <string>
#include <string_view>
#include <unordered_set>

#include "internal/mutex.h"

namespace kvtier::internal {

class StringInterner {
 public:
  // A view of this interner's copy of `s` (equal strings give the same view); empty for an
  // empty `s`. Valid until the interner is destroyed.
  std::string_view Intern(std::string_view s) {
    if (s.empty()) return {};
    MutexLock lock(&mu_);
    return *strings_.emplace(s).first;  // node-based: the string never moves
  }

 private:
  Mutex mu_;
  std::unordered_set<std::string> strings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::internal

#endif  // KVTIER_INTERNAL_INTERNED_STRING_H_
