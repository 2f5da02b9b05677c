// What every transport does with a TransportGet once it has the stored bytes, so each transport
// handles max_bytes and receivers the same way.
#ifndef KVTIER_REMOTE_TRANSPORT_ITEMS_H_
#define KVTIER_REMOTE_TRANSPORT_ITEMS_H_

#include <cstring>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvtier/transport.h"

namespace kvtier::internal {

// kInvalidArgument if the item has neither an output nor a receiver.
inline absl::Status CheckGetItem(const TransportGet& g, std::string_view transport) {
  if (g.value == nullptr && g.receiver == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(absl::string_view(transport.data(), transport.size()),
                     ": a Get item needs an output or a receiver"));
  }
  return absl::OkStatus();
}

// Hands `stored` to the item: kDataLoss over max_bytes, else through its receiver (copied into
// the buffers Begin names, then Finish), else copied into *value.
inline absl::Status DeliverValue(const TransportGet& g, absl::Span<const std::byte> stored,
                                 std::string_view transport) {
  if (g.max_bytes > 0 && static_cast<int64_t>(stored.size()) > g.max_bytes) {
    return absl::DataLossError(absl::StrCat(absl::string_view(transport.data(), transport.size()),
                                            ": value at ", g.key, " is ", stored.size(),
                                            " bytes; at most ", g.max_bytes, " expected"));
  }
  if (g.receiver == nullptr) {
    g.value->assign(stored.begin(), stored.end());
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<absl::Span<std::byte>>> buffers =
      g.receiver->Begin(static_cast<int64_t>(stored.size()));
  if (!buffers.ok()) return buffers.status();
  size_t at = 0;
  for (const absl::Span<std::byte>& b : *buffers) {
    if (b.size() > stored.size() - at) {
      return absl::InternalError("receiver buffers longer than the value");
    }
    if (!b.empty()) std::memcpy(b.data(), stored.data() + at, b.size());
    g.receiver->Received(b);
    at += b.size();
  }
  if (at != stored.size()) return absl::InternalError("receiver buffers shorter than the value");
  return g.receiver->Finish();
}

}  // namespace kvtier::internal

#endif  // KVTIER_REMOTE_TRANSPORT_ITEMS_H_
