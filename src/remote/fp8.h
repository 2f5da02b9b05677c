// Lossy bf16 -> FP8 E4M3 block conversion for the opt-in `fp8_e4m3` codec.
//
// Format: OCP 8-bit Floating Point Specification (OFP8) rev 1.0, E4M3 ("fn": bias 7, no
// infinities, S.1111.111 is NaN, largest finite 448), the format of vLLM's fp8_e4m3 KV cache and
// of NVIDIA Hopper's FP8 tensor cores. A block is scaled by one float32, amax / 448, so its
// largest magnitude maps to the top of the FP8 range (vLLM scales per tensor; per block keeps
// small blocks accurate). Rounding is to nearest, ties to even, both ways.
//
// Payload: the scale as IEEE-754 binary32 little-endian, then one FP8 byte per bf16 element in
// the block's order. Relative error of a normal value: at most 2^-4 (3 mantissa bits); values
// below amax * 2^-15 or so lose precision as FP8 subnormals or flush to zero.
#ifndef KVTIER_REMOTE_FP8_H_
#define KVTIER_REMOTE_FP8_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvtier::internal {

uint8_t FloatToFp8E4m3(float f);
float Fp8E4m3ToFloat(uint8_t code);

// `bf16` holds little-endian bf16 elements (an even number of bytes); `out` gets 4 + n bytes.
void EncodeBf16AsFp8E4m3(absl::Span<const std::byte> bf16, std::byte* out);
// The inverse, into `bf16` (2 bytes per element); `payload` must be 4 + bf16.size() / 2 bytes.
// kDataLoss for a wrong size or a scale that is not finite and positive.
absl::Status DecodeFp8E4m3AsBf16(absl::Span<const std::byte> payload, absl::Span<std::byte> bf16);

}  // namespace kvtier::internal

#endif  // KVTIER_REMOTE_FP8_H_
