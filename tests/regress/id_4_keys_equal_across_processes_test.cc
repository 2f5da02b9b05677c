// ID-4: two processes (really two, not two objects) with equal namespace and tokens compute equal
// keys; a different KV dtype, TP rank, pipeline stage or weights fingerprint gives different keys.
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier {
namespace {

struct ProcessOutput {
  int exit_code = -1;
  std::vector<std::string> lines;
};

// Runs kvtier_key_printer as its own process and collects its output lines.
ProcessOutput RunPrinter(const std::string& args) {
  ProcessOutput out;
  const std::string command = std::string(KVTIER_KEY_PRINTER) + " " + args;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[256];
  while (std::fgets(buf, sizeof(buf), pipe) != nullptr) {
    std::string line(buf);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    out.lines.push_back(line);
  }
  const int status = pclose(pipe);
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// Namespace digest first, then one key per full block (64 tokens / 16 = 4).
std::vector<std::string> KeysOf(const std::string& args) {
  ProcessOutput p = RunPrinter(args);
  EXPECT_EQ(p.exit_code, 0) << args;
  EXPECT_EQ(p.lines.size(), 5u) << args;
  for (const std::string& line : p.lines) EXPECT_EQ(line.size(), 32u) << line;
  return p.lines;
}

TEST(Regress_ID_4, TwoProcessesComputeEqualKeys) {
  for (const char* algorithm : {"algorithm=xxh3_128", "algorithm=sha256"}) {
    const std::string args = std::string("dtype=bf16 tp_rank=0 tp_size=2 weights=w1 ") + algorithm;
    const std::vector<std::string> first = KeysOf(args);
    const std::vector<std::string> second = KeysOf(args);
    EXPECT_EQ(first, second) << algorithm;
  }
}

TEST(Regress_ID_4, DtypeTpRankOrWeightsChangeEveryKey) {
  const std::vector<std::string> base = KeysOf("dtype=bf16 tp_rank=0 tp_size=2 weights=w1");
  for (const char* variant : {"dtype=fp8_e4m3 tp_rank=0 tp_size=2 weights=w1",
                              "dtype=bf16 tp_rank=1 tp_size=2 weights=w1",
                              "dtype=bf16 tp_rank=0 tp_size=2 weights=w2",
                              "dtype=bf16 tp_rank=0 tp_size=4 weights=w1"}) {
    const std::vector<std::string> other = KeysOf(variant);
    ASSERT_EQ(other.size(), base.size());
    for (size_t i = 0; i < base.size(); ++i) EXPECT_NE(other[i], base[i]) << variant << " line " << i;
  }
}

// Two pipeline stages with equal geometry (32 layers each): another stage, or the same stage
// numbering over other layers, changes every key; the same stage in two processes does not.
TEST(Regress_ID_4, PipelineStageChangesEveryKey) {
  const std::string stage1 = "pp_rank=1 pp_size=2 first_layer=32";
  const std::vector<std::string> base = KeysOf(stage1);
  EXPECT_EQ(KeysOf(stage1), base);
  for (const char* variant :
       {"pp_rank=0 pp_size=2 first_layer=32", "pp_rank=1 pp_size=2 first_layer=0", ""}) {
    const std::vector<std::string> other = KeysOf(variant);
    ASSERT_EQ(other.size(), base.size());
    for (size_t i = 0; i < base.size(); ++i)
      EXPECT_NE(other[i], base[i]) << variant << " line " << i;
  }
}

TEST(Regress_ID_4, PrinterRejectsBadArguments) {
  EXPECT_EQ(RunPrinter("dtype=int3 2>/dev/null").exit_code, 2);
  EXPECT_EQ(RunPrinter("tp_rank=2 tp_size=2 2>/dev/null").exit_code, 2);
  EXPECT_EQ(RunPrinter("pp_rank=2 pp_size=2 2>/dev/null").exit_code, 2);
  EXPECT_EQ(RunPrinter("first_layer=-1 2>/dev/null").exit_code, 2);
}

}  // namespace
}  // namespace kvtier
