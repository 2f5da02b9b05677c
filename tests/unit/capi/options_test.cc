// The C ABI's option conversions (src/capi/options.cc), read on the C++ side.
#include <cstdint>
#include <string>
#include <vector>

#include "capi/handles.h"
#include "gtest/gtest.h"
#include "kvtier/c/kvtier.h"
#include "kvtier/prefix_hasher.h"
#include "tests/testing/status_matchers.h"

namespace kvtier::capi {
namespace {

// Found in review: the header says a string of the tier stack options is unset when NULL or "",
// but remote_key_prefix "" set an empty prefix, so two deployments sharing a store with "" and
// with NULL wrote under different keys. "" now means the default as NULL does.
TEST(CapiOptionsTest, AnEmptyRemoteKeyPrefixIsUnset) {
  auto geometry = KvGeometry::Create({.num_layers = 1, .num_kv_heads = 1, .head_dim = 8});
  ASSERT_TRUE(geometry.ok());
  auto ns = CacheNamespace::Create(*geometry, {.model_id = "m", .weights_fingerprint = "w"});
  ASSERT_TRUE(ns.ok());
  kvtier_tier_stack_options o;
  kvtier_tier_stack_options_init(&o);
  o.tiers[KVTIER_TIER_REMOTE].capacity_blocks = 4;
  o.remote_directory = "/tmp/unused";
  const std::string fallback = RemoteTierOptions{}.key_prefix;
  for (const char* prefix : {static_cast<const char*>(nullptr), "", "fleet7:"}) {
    o.remote_key_prefix = prefix;
    KVTIER_ASSERT_OK_AND_ASSIGN(TierStackOptions t, ToTierStackOptions(*ns, o));
    EXPECT_EQ(t.remote.key_prefix,
              prefix == nullptr || prefix[0] == '\0' ? fallback : std::string(prefix))
        << (prefix == nullptr ? "NULL" : prefix);
  }
  EXPECT_EQ(fallback, "kvtier:");
}

// Found in review: the header says fields of an absent or metadata tier are not looked at, but a
// metadata tier's engine, codec and HBM backend fields were range-checked, and the HBM tensor
// array was read with no native HBM tier. Now only a native tier's fields are read.
TEST(CapiOptionsTest, AMetadataTiersFieldsAreNotLookedAt) {
  auto geometry = KvGeometry::Create({.num_layers = 1, .num_kv_heads = 1, .head_dim = 8});
  ASSERT_TRUE(geometry.ok());
  auto ns = CacheNamespace::Create(*geometry, {.model_id = "m", .weights_fingerprint = "w"});
  ASSERT_TRUE(ns.ok());
  kvtier_tier_stack_options o;
  kvtier_tier_stack_options_init(&o);
  for (int t = 0; t < 4; ++t) {
    o.tiers[t].capacity_blocks = 8;
    o.tiers[t].kind = KVTIER_BACKEND_METADATA;
  }
  o.nvme_engine = static_cast<kvtier_nvme_engine>(7);
  o.remote_codec = static_cast<kvtier_codec>(9);
  o.hbm_backend = static_cast<kvtier_hbm_backend>(5);
  o.hbm_num_tensors = 3;  // with hbm_tensors NULL: never read
  // Nor their strings (found by a later review: these were copied whatever the tier), which a
  // caller may leave pointing at freed memory.
  o.nvme_path = "/nvme/unused";
  o.remote_directory = "/remote/unused";
  o.remote_url = "redis://unused:1";
  o.remote_key_prefix = "unused:";
  o.remote_hmac_secret = "unused";
  KVTIER_ASSERT_OK_AND_ASSIGN(TierStackOptions t, ToTierStackOptions(*ns, o));
  EXPECT_TRUE(t.hbm.external_pool.empty());
  EXPECT_EQ(t.nvme.path, "");
  EXPECT_EQ(t.remote_directory, "");
  EXPECT_EQ(t.remote_url, "");
  EXPECT_EQ(t.remote.key_prefix, RemoteTierOptions{}.key_prefix);
  EXPECT_TRUE(t.remote.hmac_secret.empty());
  // A native NVMe tier's engine is checked, and a native HBM tier's tensor count.
  o.tiers[KVTIER_TIER_NVME].kind = KVTIER_BACKEND_NATIVE;
  EXPECT_THAT(ToTierStackOptions(*ns, o),
              testing::IsError(absl::StatusCode::kInvalidArgument, "nvme_engine"));
  o.tiers[KVTIER_TIER_NVME].kind = KVTIER_BACKEND_METADATA;
  o.tiers[KVTIER_TIER_HBM].kind = KVTIER_BACKEND_NATIVE;
  o.hbm_backend = KVTIER_HBM_EMULATED;
  EXPECT_THAT(ToTierStackOptions(*ns, o),
              testing::IsError(absl::StatusCode::kInvalidArgument, "hbm_tensors is NULL"));
  std::vector<void*> tensors(3, reinterpret_cast<void*>(0x1000));
  o.hbm_tensors = tensors.data();
  EXPECT_THAT(ToTierStackOptions(*ns, o),
              testing::IsError(absl::StatusCode::kInvalidArgument, "more than the 1 layers"));
}

// Found in review: the salt's and digests' bytes were copied before their lengths were checked,
// so a length past the caller's buffer read beyond it (PrefixHasher refused the length only
// after the copy; SIZE_MAX threw and came back as kInternal). Lengths are now checked first.
TEST(CapiOptionsTest, ExtraLengthsAreCheckedBeforeTheBytesAreRead) {
  const std::vector<uint8_t> bytes(PrefixHasher::kMaxExtraBytes + 1, 7);
  kvtier_sequence_options o{};
  o.tenant_salt = bytes.data();
  o.tenant_salt_bytes = PrefixHasher::kMaxExtraBytes + 1;
  EXPECT_THAT(ToSequenceOptions(&o),
              testing::IsError(absl::StatusCode::kInvalidArgument, "kMaxExtraBytes"));
  o.tenant_salt_bytes = SIZE_MAX;
  EXPECT_THAT(ToSequenceOptions(&o),
              testing::IsError(absl::StatusCode::kInvalidArgument, "kMaxExtraBytes"));
  o.tenant_salt_bytes = PrefixHasher::kMaxExtraBytes;  // at the limit: taken whole
  KVTIER_ASSERT_OK_AND_ASSIGN(SequenceOptions at_limit, ToSequenceOptions(&o));
  ASSERT_TRUE(at_limit.tenant_salt.has_value());
  EXPECT_EQ(at_limit.tenant_salt->size(), PrefixHasher::kMaxExtraBytes);

  o.tenant_salt = nullptr;
  o.tenant_salt_bytes = 0;
  kvtier_multimodal_item item{};
  item.start_token = 0;
  item.num_tokens = 4;
  item.digest = bytes.data();
  item.digest_bytes = PrefixHasher::kMaxDigestBytes + 1;
  o.multimodal = &item;
  o.num_multimodal = 1;
  EXPECT_THAT(ToSequenceOptions(&o),
              testing::IsError(absl::StatusCode::kInvalidArgument, "kMaxDigestBytes"));
  item.digest_bytes = SIZE_MAX;
  EXPECT_THAT(ToSequenceOptions(&o),
              testing::IsError(absl::StatusCode::kInvalidArgument, "kMaxDigestBytes"));
  item.digest_bytes = PrefixHasher::kMaxDigestBytes;
  KVTIER_ASSERT_OK_AND_ASSIGN(SequenceOptions digest, ToSequenceOptions(&o));
  ASSERT_EQ(digest.multimodal.size(), 1u);
  EXPECT_EQ(digest.multimodal[0].digest.size(), PrefixHasher::kMaxDigestBytes);
}

}  // namespace
}  // namespace kvtier::capi
