// FP8 e4m3 conversion (fp8.h): the lossy opt-in codec's element transform.
#include "remote/fp8.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtier::internal {
namespace {

constexpr float kFp8Max = 448.0f;

float Bf16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t FloatToBf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // stays a quiet NaN
  const uint32_t rounded = bits + 0x7FFF + ((bits >> 16) & 1);           // nearest, ties to even
  return static_cast<uint16_t>(rounded >> 16);
}

std::array<float, 256> MakeDecodeTable() {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) {
    const int exp = (c >> 3) & 0xF;
    const int man = c & 7;
    float v = 0;
    if (exp == 0xF && man == 7) {
      v = std::nanf("");
    } else if (exp == 0) {
      v = std::ldexp(static_cast<float>(man), -9);  // subnormal: man * 2^-9
    } else {
      v = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
    }
    t[static_cast<size_t>(c)] = (c & 0x80) != 0 ? -v : v;
  }
  return t;
}

const std::array<float, 256>& DecodeTable() {
  static const std::array<float, 256> table = MakeDecodeTable();
  return table;
}

}  // namespace

uint8_t FloatToFp8E4m3(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  if (std::isnan(f)) return sign | 0x7F;
  const float a = std::fabs(f);
  if (a >= kFp8Max) return sign | 0x7E;  // saturate: E4M3fn has no infinity
  if (a < 0.015625f) {                   // below 2^-6: FP8 subnormals, steps of 2^-9
    // nearbyint rounds half to even; 8 * 2^-9 = 2^-6 is code 0x08, the smallest normal.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  // Normal: round the 23-bit mantissa to 3 bits, ties to even; a carry moves into the exponent.
  const uint32_t abs_bits = bits & 0x7FFFFFFF;
  const uint32_t rounded = abs_bits + ((1u << 19) - 1) + ((abs_bits >> 20) & 1);
  const int exp = static_cast<int>(rounded >> 23) - 127 + 7;
  const auto man = static_cast<uint8_t>((rounded >> 20) & 7);
  if (exp > 15 || (exp == 15 && man == 7)) return sign | 0x7E;
  return sign | static_cast<uint8_t>(exp << 3) | man;
}

float Fp8E4m3ToFloat(uint8_t code) { return DecodeTable()[code]; }

void EncodeBf16AsFp8E4m3(absl::Span<const std::byte> bf16, std::byte* out) {
  const size_t n = bf16.size() / 2;
  auto element = [&](size_t i) {
    uint16_t b;
    std::memcpy(&b, bf16.data() + 2 * i, 2);
    return Bf16ToFloat(b);
  };
  float amax = 0;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(element(i));
    if (std::isfinite(a) && a > amax) amax = a;
  }
  const float scale = amax > 0 ? amax / kFp8Max : 1.0f;
  const float inverse = 1.0f / scale;
  const uint32_t scale_bits = std::bit_cast<uint32_t>(scale);
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::byte>((scale_bits >> (8 * i)) & 0xFF);
  for (size_t i = 0; i < n; ++i)
    out[4 + i] = static_cast<std::byte>(FloatToFp8E4m3(element(i) * inverse));
}

absl::Status DecodeFp8E4m3AsBf16(absl::Span<const std::byte> payload, absl::Span<std::byte> bf16) {
  const size_t n = bf16.size() / 2;
  if (bf16.size() % 2 != 0 || payload.size() != 4 + n) {
    return absl::DataLossError(absl::StrCat("fp8_e4m3: a payload of ", payload.size(),
                                            " bytes for ", bf16.size(), " bytes of bf16"));
  }
  uint32_t scale_bits = 0;
  for (int i = 0; i < 4; ++i)
    scale_bits |= static_cast<uint32_t>(payload[static_cast<size_t>(i)]) << (8 * i);
  const float scale = std::bit_cast<float>(scale_bits);
  if (!std::isfinite(scale) || scale <= 0) {
    return absl::DataLossError(
        absl::StrCat("fp8_e4m3: scale ", scale, " is not finite and positive"));
  }
  const std::array<float, 256>& table = DecodeTable();
  for (size_t i = 0; i < n; ++i) {
    const uint16_t b = FloatToBf16(table[static_cast<uint8_t>(payload[4 + i])] * scale);
    std::memcpy(bf16.data() + 2 * i, &b, 2);
  }
  return absl::OkStatus();
}

}  // namespace kvtier::internal
