// Transport (transport.h): the shared helpers of the key-value store interface.
#include "kvtier/transport.h"

#include "absl/strings/str_cat.h"
#include "internal/hex.h"

namespace kvtier {

std::string RemoteBlockKey(std::string_view prefix, const std::array<uint8_t, 16>& ns_digest,
                           const BlockKey& key) {
  return absl::StrCat(absl::string_view(prefix.data(), prefix.size()),
                      internal::HexEncode(ns_digest.data(), ns_digest.size()), ":", key.ToHex());
}

}  // namespace kvtier
