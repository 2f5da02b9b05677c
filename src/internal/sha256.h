// SHA-256 through OpenSSL's EVP interface. Kept behind this header so no public header includes
// OpenSSL (STYLE rule 2).
#ifndef KVTIER_INTERNAL_SHA256_H_
#define KVTIER_INTERNAL_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace kvtier::internal {

using Sha256Digest = std::array<uint8_t, 32>;

// Reusable hashing context: create once per call site and hash many messages without allocating.
// Thread-compatible: one context per thread.
class Sha256 {
 public:
  // Errors: kInternal if OpenSSL cannot provide SHA-256 (e.g. a FIPS provider without it).
  static absl::StatusOr<Sha256> Create();
  Sha256(Sha256&& other) noexcept;
  Sha256& operator=(Sha256&& other) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  ~Sha256();

  // SHA-256 of `size` bytes at `data`. Errors: kInternal if OpenSSL fails.
  absl::StatusOr<Sha256Digest> Hash(const void* data, size_t size);

 private:
  Sha256(void* md, void* ctx) : md_(md), ctx_(ctx) {}
  void* md_ = nullptr;   // EVP_MD*, fetched once
  void* ctx_ = nullptr;  // EVP_MD_CTX*
};

}  // namespace kvtier::internal

#endif  // KVTIER_INTERNAL_SHA256_H_
