// What every transport does with a TransportGet once it has the stored bytes, and the size of a
// TransportPut's value, so each transport handles max_bytes, sinks and prefixes the same way.
#ifndef KVTIER_REMOTE_TRANSPORT_ITEMS_H_
#define KVTIER_REMOTE_TRANSPORT_ITEMS_H_

#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvtier/transport.h"

namespace kvtier::internal {

// kInvalidArgument if the item has neither an output nor a sink.
inline absl::Status CheckGetItem(const TransportGet& g, std::string_view transport) {
  if (g.value == nullptr && !g.sink) {
    return absl::InvalidArgumentError(
        absl::StrCat(absl::string_view(transport.data(), transport.size()),
                     ": a Get item needs an output or a sink"));
  }
  return absl::OkStatus();
}

// Hands `stored` to the item: kDataLoss over max_bytes, else the sink's status, else a copy into
// *value.
inline absl::Status DeliverValue(const TransportGet& g, absl::Span<const std::byte> stored,
                                 std::string_view transport) {
  if (g.max_bytes > 0 && static_cast<int64_t>(stored.size()) > g.max_bytes) {
    return absl::DataLossError(absl::StrCat(absl::string_view(transport.data(), transport.size()),
                                            ": value at ", g.key, " is ", stored.size(),
                                            " bytes; at most ", g.max_bytes, " expected"));
  }
  if (g.sink) return g.sink(stored);
  g.value->assign(stored.begin(), stored.end());
  return absl::OkStatus();
}

inline int64_t PutBytes(const TransportPut& p) {
  return static_cast<int64_t>(p.value_prefix.size() + p.value.size());
}

}  // namespace kvtier::internal

#endif  // KVTIER_REMOTE_TRANSPORT_ITEMS_H_
