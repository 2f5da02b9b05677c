// PrefixHasher (prefix_hasher.h): chained block keys over namespace, parent, extras, tokens.
#include "kvtier/prefix_hasher.h"

#include <bit>
#include <cstring>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/byte_writer.h"
#include "internal/sha256.h"
#include "internal/status_macros.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvtier {
namespace {

// Field tags of the block key message (docs/formats.md, "Block key"). Never reuse a tag.
enum KeyTag : uint8_t {
  kTagAdapterId = 0x01,
  kTagAdapterLoadGeneration = 0x02,
  kTagTenantSalt = 0x03,
  kTagMultimodalItem = 0x04,
  kTagTokens = 0x10,
};

constexpr size_t kParentOffset = 16;  // after the namespace digest

absl::Status ValidateExtras(const BlockExtras& extras) {
  if (extras.adapter.has_value()) {
    const size_t n = extras.adapter->id.size();
    if (n == 0 || n > PrefixHasher::kMaxExtraBytes) {
      return absl::InvalidArgumentError(absl::StrCat("BlockExtras: adapter id has ", n,
                                                     " bytes; it must have 1 to ",
                                                     PrefixHasher::kMaxExtraBytes));
    }
  }
  if (extras.tenant_salt.has_value() && extras.tenant_salt->size() > PrefixHasher::kMaxExtraBytes) {
    return absl::InvalidArgumentError(absl::StrCat("BlockExtras: tenant salt has ",
                                                   extras.tenant_salt->size(),
                                                   " bytes; at most ", PrefixHasher::kMaxExtraBytes));
  }
  int64_t previous_end = 0;
  for (size_t i = 0; i < extras.multimodal.size(); ++i) {
    const MultimodalItem& item = extras.multimodal[i];
    if (item.start_token < 0 || item.num_tokens < 1 ||
        item.num_tokens > INT64_MAX - item.start_token) {
      return absl::InvalidArgumentError(absl::StrCat(
          "BlockExtras: multimodal item ", i, " has start_token = ", item.start_token,
          " and num_tokens = ", item.num_tokens, " (need start >= 0, num_tokens >= 1)"));
    }
    if (item.digest.empty() || item.digest.size() > PrefixHasher::kMaxDigestBytes) {
      return absl::InvalidArgumentError(absl::StrCat("BlockExtras: multimodal item ", i,
                                                     " digest has ", item.digest.size(),
                                                     " bytes; it must have 1 to ",
                                                     PrefixHasher::kMaxDigestBytes));
    }
    if (i > 0 && item.start_token < previous_end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "BlockExtras: multimodal item ", i, " starts at ", item.start_token,
          ", before the previous item ends at ", previous_end, " (items must be sorted and disjoint)"));
    }
    previous_end = item.start_token + item.num_tokens;
  }
  return absl::OkStatus();
}

// Token ids as little-endian int32, `tokens.size() * 4` bytes at `out`.
void StoreTokens(absl::Span<const int32_t> tokens, uint8_t* out) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(out, tokens.data(), tokens.size() * sizeof(int32_t));
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      internal::StoreU32Le(out + 4 * i, static_cast<uint32_t>(tokens[i]));
    }
  }
}

}  // namespace

std::string_view HashAlgorithmName(HashAlgorithm algorithm) {
  switch (algorithm) {
    case HashAlgorithm::kXxh3_128:
      return "xxh3_128";
    case HashAlgorithm::kSha256:
      return "sha256";
  }
  return "unknown";
}

absl::StatusOr<PrefixHasher> PrefixHasher::Create(const CacheNamespace& ns,
                                                  HashAlgorithm algorithm) {
  if (algorithm == HashAlgorithm::kSha256) {
    // Fail at creation, not on the first key, if this OpenSSL cannot do SHA-256.
    KVTIER_RETURN_IF_ERROR(internal::Sha256::Create().status());
  } else if (algorithm != HashAlgorithm::kXxh3_128) {
    return absl::InvalidArgumentError(
        absl::StrCat("PrefixHasher: unknown hash algorithm ", static_cast<int>(algorithm)));
  }
  return PrefixHasher(ns.digest(), ns.geometry().tokens_per_block(), algorithm);
}

absl::Status PrefixHasher::AppendBlockKeys(BlockKey parent, int64_t first_position,
                                           absl::Span<const int32_t> tokens,
                                           const BlockExtras& extras,
                                           std::vector<BlockKey>* keys) const {
  if (keys == nullptr) return absl::InvalidArgumentError("PrefixHasher: keys is null");
  const int64_t b = tokens_per_block_;
  if (first_position < 0 || first_position % b != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PrefixHasher: first_position = ",
                                                   first_position,
                                                   " is not a non-negative multiple of ", b));
  }
  if (first_position > kMaxPosition - static_cast<int64_t>(tokens.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PrefixHasher: first_position = ", first_position, " plus ", tokens.size(),
        " tokens passes the largest position ", kMaxPosition));
  }
  if ((first_position == 0) != (parent == kRootBlockKey)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PrefixHasher: parent ", parent.ToHex(), " does not fit first_position = ", first_position,
        " (the root key is the parent of position 0 and of nothing else)"));
  }
  KVTIER_RETURN_IF_ERROR(ValidateExtras(extras));

  const size_t num_blocks = tokens.size() / static_cast<size_t>(b);
  if (num_blocks == 0) return absl::OkStatus();

  std::optional<internal::Sha256> sha;
  if (algorithm_ == HashAlgorithm::kSha256) {
    KVTIER_ASSIGN_OR_RETURN(sha, internal::Sha256::Create());
  }

  // The message of every block shares its head: namespace digest, a parent slot, and the
  // request-wide extras. Only the parent, the items overlapping the block and the tokens change,
  // so each block rewrites them in place and hashes the buffer (no allocation per block).
  std::vector<uint8_t> buf;
  internal::ByteWriter head(&buf);
  head.Bytes(namespace_digest_.data(), namespace_digest_.size());
  head.Bytes(kRootBlockKey.ToBytes().data(), 16);  // parent, rewritten per block
  if (extras.adapter.has_value()) {
    head.Field(kTagAdapterId, extras.adapter->id);
    head.FieldU64(kTagAdapterLoadGeneration, extras.adapter->load_generation);
  }
  if (extras.tenant_salt.has_value()) head.Field(kTagTenantSalt, *extras.tenant_salt);
  const size_t head_size = buf.size();
  const size_t token_bytes = sizeof(int32_t) * static_cast<size_t>(b);
  buf.resize(head_size + 5 + token_bytes);

  const size_t keys_before = keys->size();
  keys->reserve(keys_before + num_blocks);
  std::vector<uint8_t> items_buf;  // the multimodal fields of one block
  const auto& items = extras.multimodal;
  size_t item = 0;  // first multimodal item that may overlap the current or a later block
  BlockKey prev = parent;
  for (size_t i = 0; i < num_blocks; ++i) {
    internal::StoreU64Be(buf.data() + kParentOffset, prev.hi);
    internal::StoreU64Be(buf.data() + kParentOffset + 8, prev.lo);
    size_t n = head_size;
    if (!items.empty()) {
      const int64_t block_start = first_position + static_cast<int64_t>(i) * b;
      const int64_t block_end = block_start + b;
      while (item < items.size() && items[item].start_token + items[item].num_tokens <= block_start) {
        ++item;
      }
      items_buf.clear();
      internal::ByteWriter w(&items_buf);
      for (size_t j = item; j < items.size() && items[j].start_token < block_end; ++j) {
        const MultimodalItem& m = items[j];
        w.U8(kTagMultimodalItem);
        w.U32(static_cast<uint32_t>(16 + m.digest.size()));
        w.U64(static_cast<uint64_t>(m.start_token - block_start));  // two's complement if before
        w.U64(static_cast<uint64_t>(m.num_tokens));
        w.Bytes(m.digest.data(), m.digest.size());
      }
      if (buf.size() < head_size + items_buf.size() + 5 + token_bytes) {
        buf.resize(head_size + items_buf.size() + 5 + token_bytes);
      }
      if (!items_buf.empty()) std::memcpy(buf.data() + n, items_buf.data(), items_buf.size());
      n += items_buf.size();
    }
    buf[n] = kTagTokens;
    internal::StoreU32Le(buf.data() + n + 1, static_cast<uint32_t>(token_bytes));
    n += 5;
    StoreTokens(tokens.subspan(i * b, b), buf.data() + n);
    n += token_bytes;

    BlockKey key;
    if (sha.has_value()) {
      absl::StatusOr<internal::Sha256Digest> d = sha->Hash(buf.data(), n);
      if (!d.ok()) {
        keys->resize(keys_before);  // nothing appended on error
        return d.status();
      }
      key.hi = internal::LoadU64Be(d->data());
      key.lo = internal::LoadU64Be(d->data() + 8);
    } else {
      const XXH128_hash_t h = XXH3_128bits(buf.data(), n);
      key.hi = h.high64;  // XXH128_canonical_t is big-endian high64 then low64, as BlockKey
      key.lo = h.low64;
    }
    keys->push_back(key);
    prev = key;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<BlockKey>> PrefixHasher::BlockKeys(absl::Span<const int32_t> tokens,
                                                              const BlockExtras& extras) const {
  std::vector<BlockKey> keys;
  KVTIER_RETURN_IF_ERROR(AppendBlockKeys(kRootBlockKey, 0, tokens, extras, &keys));
  return keys;
}

}  // namespace kvtier
