// BlockKey: the 128-bit content identity of one full block (DESIGN section 4). Equal keys mean
// equal KV bytes, in any process on any machine, for blocks of the same CacheNamespace.
// Keys are made by PrefixHasher; this header only defines the value.
//
// Thread-safety: a plain value; safe to copy and read from any thread.
#ifndef KVTIER_BLOCK_KEY_H_
#define KVTIER_BLOCK_KEY_H_

#include <array>
#include <compare>
#include <cstdint>
#include <string>
#include <utility>

namespace kvtier {

struct BlockKey {
  // The key as one big-endian 128-bit number: `hi` holds bytes 0..7, `lo` bytes 8..15 of
  // ToBytes(). For XXH3-128 this is XXH128_canonical_t; for SHA-256 the first 16 digest bytes.
  uint64_t hi = 0;
  uint64_t lo = 0;

  // 16 bytes, big-endian (hi first). This is the form stored on disk and in remote keys.
  std::array<uint8_t, 16> ToBytes() const;
  static BlockKey FromBytes(const std::array<uint8_t, 16>& bytes);
  // 32 lower-case hex digits of ToBytes(), e.g. "06b05ab6733a618578af5f94892f3950".
  std::string ToHex() const;

  friend constexpr auto operator<=>(const BlockKey&, const BlockKey&) = default;

  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& key) {
    // The key is already a uniform hash; one word is enough entropy for a hash table.
    return H::combine(std::move(h), key.lo);
  }
};

// The parent of block 0 of every sequence. Never the key of a real block (probability 2^-128).
inline constexpr BlockKey kRootBlockKey{};

}  // namespace kvtier

#endif  // KVTIER_BLOCK_KEY_H_
