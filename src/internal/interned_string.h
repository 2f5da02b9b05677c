// InternString: one copy per distinct string for the life of the process, so a std::string_view
// of it never dangles. For the few strings every cache event names (adapter ids, worker ids):
// an event then carries a 16-byte view instead of an allocation, copies freely and may outlive
// the cache that made it.
//
// Cost: each distinct string is kept (with a hash-set node) until the process exits; intern only
// strings drawn from a small set (an engine's loaded adapters, a worker's name), never per-request
// data. Thread-safe (one mutex; intern once per sequence or cache, not per event).
#ifndef KVTIER_INTERNAL_INTERNED_STRING_H_
#define KVTIER_INTERNAL_INTERNED_STRING_H_

#include <string_view>

namespace kvtier::internal {

// A view of the process's copy of `s` (equal strings give the same view); empty for an empty
// `s`. Valid until the process exits.
std::string_view InternString(std::string_view s);

}  // namespace kvtier::internal

#endif  // KVTIER_INTERNAL_INTERNED_STRING_H_
