// The C ABI's option conversions (src/capi/options.cc), read on the C++ side.
#include <string>

#include "capi/handles.h"
#include "gtest/gtest.h"
#include "kvtier/c/kvtier.h"
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

}  // namespace
}  // namespace kvtier::capi
