#include "bench/replay/trace/csv.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::replay {
namespace {

using ::testing::ElementsAre;

TEST(SplitCsvLineTest, SplitsAtCommas) {
  EXPECT_THAT(SplitCsvLine("model,layers,head_dim"), ElementsAre("model", "layers", "head_dim"));
  EXPECT_THAT(SplitCsvLine("a,,b,"), ElementsAre("a", "", "b", ""));
  EXPECT_THAT(SplitCsvLine(""), ElementsAre(""));
}

TEST(SplitCsvLineTest, QuotedFieldsKeepCommasAndEscapedQuotes) {
  EXPECT_THAT(SplitCsvLine(R"(x,"a, b",y)"), ElementsAre("x", "a, b", "y"));
  EXPECT_THAT(SplitCsvLine(R"("say ""hi""",2)"), ElementsAre(R"(say "hi")", "2"));
  EXPECT_THAT(SplitCsvLine(R"("",z)"), ElementsAre("", "z"));
  // Quoting opens and closes wherever a quote stands; an unclosed quote runs to the end.
  EXPECT_THAT(SplitCsvLine(R"(a"b,c"d,e)"), ElementsAre("ab,cd", "e"));
  EXPECT_THAT(SplitCsvLine(R"(a,"b,c)"), ElementsAre("a", "b,c"));
}

TEST(SplitCsvLineTest, DropsCarriageReturnsOutsideQuotes) {
  EXPECT_THAT(SplitCsvLine("a,b\r"), ElementsAre("a", "b"));
  EXPECT_THAT(SplitCsvLine("\"a\rb\",c\r"), ElementsAre("a\rb", "c"));
}

}  // namespace
}  // namespace kvtier::replay
