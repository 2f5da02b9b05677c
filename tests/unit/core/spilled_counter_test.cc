#include "cache/spilled_counter.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace kvtier::internal {
namespace {

// Up from 0 to well past the spill point and back down, for narrow fields of 1, 2 and 19 bits:
// the value is exact at every step, and the form is narrow-only below the spill point and
// wide-only from it on.
TEST(SpilledCounterTest, CountsExactlyAcrossTheSpillPointBothWays) {
  for (const uint32_t spill : {1u, 3u, (1u << 19) - 1}) {
    SCOPED_TRACE(spill);
    SpilledCounter c;
    const uint32_t top = spill + 5;
    for (uint32_t v = 1; v <= top; ++v) {
      c = c.Step(+1, spill);
      ASSERT_EQ(c.value(spill), v);
      ASSERT_EQ(c.narrow, v < spill ? v : spill);
      ASSERT_EQ(c.wide, v < spill ? 0 : v);
    }
    for (uint32_t v = top; v-- > 0;) {
      c = c.Step(-1, spill);
      ASSERT_EQ(c.value(spill), v);
      ASSERT_EQ(c.narrow, v < spill ? v : spill);
      ASSERT_EQ(c.wide, v < spill ? 0 : v);
    }
  }
}

}  // namespace
}  // namespace kvtier::internal
