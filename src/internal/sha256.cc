// SHA-256 (sha256.h) through OpenSSL's EVP interface.
#include "internal/sha256.h"

#include <openssl/evp.h>

#include <utility>

#include "absl/status/status.h"

namespace kvtier::internal {

absl::StatusOr<Sha256> Sha256::Create() {
  // An explicit fetch avoids OpenSSL 3's implicit per-call algorithm lookup in DigestInit.
  EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  if (md == nullptr) return absl::InternalError("OpenSSL: SHA-256 is not available");
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (ctx == nullptr) {
    EVP_MD_free(md);
    return absl::InternalError("OpenSSL: EVP_MD_CTX_new failed");
  }
  return Sha256(md, ctx);
}

Sha256::Sha256(Sha256&& other) noexcept
    : md_(std::exchange(other.md_, nullptr)), ctx_(std::exchange(other.ctx_, nullptr)) {}

Sha256& Sha256::operator=(Sha256&& other) noexcept {
  if (this != &other) {
    std::swap(md_, other.md_);
    std::swap(ctx_, other.ctx_);
  }
  return *this;
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
  EVP_MD_free(static_cast<EVP_MD*>(md_));
}

absl::StatusOr<Sha256Digest> Sha256::Hash(const void* data, size_t size) {
  auto* ctx = static_cast<EVP_MD_CTX*>(ctx_);
  Sha256Digest out;
  unsigned int len = 0;
  if (EVP_DigestInit_ex2(ctx, static_cast<EVP_MD*>(md_), nullptr) != 1 ||
      EVP_DigestUpdate(ctx, data, size) != 1 || EVP_DigestFinal_ex(ctx, out.data(), &len) != 1 ||
      len != out.size()) {
    return absl::InternalError("OpenSSL: SHA-256 digest failed");
  }
  return out;
}

}  // namespace kvtier::internal
