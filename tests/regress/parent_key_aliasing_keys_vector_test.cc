// What broke: AppendBlockKeys took `parent` by reference, and the natural continuation call
// passes `keys.back()` as the parent while appending to `keys`. Growing the vector freed the
// parent before it was read (heap-use-after-free under ASan; silently wrong keys otherwise).
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kvtier/prefix_hasher.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

TEST(Regress_ParentKeyAliasesKeysVector, ContinuationFromBackOfFullVector) {
  const PrefixHasher hasher = testing::MakeHasher(16);
  const std::vector<int32_t> tokens = testing::Iota(16 * 40);
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<BlockKey> whole, hasher.BlockKeys(tokens));

  std::vector<BlockKey> keys;
  KVTIER_ASSERT_OK(hasher.AppendBlockKeys(kRootBlockKey, 0,
                                          absl::MakeConstSpan(tokens).subspan(0, 16), {}, &keys));
  for (int block = 1; block < 40; ++block) {
    keys.shrink_to_fit();  // the next append must reallocate, freeing keys.back()
    KVTIER_ASSERT_OK(hasher.AppendBlockKeys(
        keys.back(), 16 * block, absl::MakeConstSpan(tokens).subspan(16 * block, 16), {}, &keys));
  }
  EXPECT_EQ(keys, whole);
}

}  // namespace
}  // namespace kvtier
