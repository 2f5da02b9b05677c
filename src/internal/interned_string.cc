#include "internal/interned_string.h"

#include <string>
#include <unordered_set>

#include "internal/mutex.h"

namespace kvtier::internal {

std::string_view InternString(std::string_view s) {
  if (s.empty()) return {};
  // Leaked on purpose: the views handed out must outlive every static destructor that might
  // still hold an event.
  static Mutex* const mu = new Mutex;
  static auto* const strings = new std::unordered_set<std::string>;
  MutexLock lock(mu);
  return *strings->emplace(s).first;  // node-based: the string never moves
}

}  // namespace kvtier::internal
