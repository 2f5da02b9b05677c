// BlockKey (block_key.h): the 128-bit block identity and its hex form.
#include "kvtier/block_key.h"

#include "internal/byte_writer.h"
#include "internal/hex.h"

namespace kvtier {

std::array<uint8_t, 16> BlockKey::ToBytes() const {
  std::array<uint8_t, 16> out;
  internal::StoreU64Be(out.data(), hi);
  internal::StoreU64Be(out.data() + 8, lo);
  return out;
}

BlockKey BlockKey::FromBytes(const std::array<uint8_t, 16>& bytes) {
  return BlockKey{.hi = internal::LoadU64Be(bytes.data()),
                  .lo = internal::LoadU64Be(bytes.data() + 8)};
}

std::string BlockKey::ToHex() const {
  const std::array<uint8_t, 16> bytes = ToBytes();
  return internal::HexEncode(bytes.data(), bytes.size());
}

}  // namespace kvtier
