// Lower-case hex encoding of raw bytes, for keys and digests in messages and golden tests.
#ifndef KVTIER_INTERNAL_HEX_H_
#define KVTIER_INTERNAL_HEX_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvtier::internal {

inline std::string HexEncode(const uint8_t* data, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * size, '0');
  for (size_t i = 0; i < size; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 0xf];
  }
  return out;
}

}  // namespace kvtier::internal

#endif  // KVTIER_INTERNAL_HEX_H_
