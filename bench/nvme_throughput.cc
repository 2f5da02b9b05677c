// Drives the NVMe tier like fio drives a file, for bench/nvme_vs_fio.sh: whole blocks, a fixed
// number in flight, for a fixed time, then prints one line "bytes_per_second=<payload bytes/s>".
//
// Usage: kvtier_nvme_throughput --path=F --size=BYTES --block=BYTES --depth=N --seconds=S
//                               --mode=write|read [--engine=io_uring|thread_pool]
// The block size must be a whole number of Llama-3.1-8B tokens (128 KiB). Read mode reads the
// blocks a previous write run left (the tier recovers them from their headers). Exit code 2 on a
// bad argument or an error, with the reason on stderr.
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "kvtier/nvme_tier.h"

namespace {

int Fail(const std::string& why) {
  std::fprintf(stderr, "kvtier_nvme_throughput: %s\n", why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path, mode = "write", engine = "io_uring";
  int64_t size = 0, block = 2 << 20, depth = 16;
  double seconds = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq),
                      value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    bool ok = true;
    if (key == "--path")
      path = value;
    else if (key == "--mode")
      mode = value;
    else if (key == "--engine")
      engine = value;
    else if (key == "--size")
      ok = absl::SimpleAtoi(value, &size);
    else if (key == "--block")
      ok = absl::SimpleAtoi(value, &block);
    else if (key == "--depth")
      ok = absl::SimpleAtoi(value, &depth);
    else if (key == "--seconds")
      ok = absl::SimpleAtod(value, &seconds);
    else
      return Fail("unknown argument " + arg);
    if (!ok) return Fail("bad value in " + arg);
  }
  if (path.empty() || size <= 0 || (mode != "write" && mode != "read")) {
    return Fail("need --path, --size and --mode=write|read");
  }
  auto geometry =
      kvtier::KvGeometry::Create({.num_layers = 32,
                                  .num_kv_heads = 8,
                                  .head_dim = 128,
                                  .tokens_per_block = static_cast<int>(block / 131072)});
  if (!geometry.ok() || geometry->bytes_per_block() != block) {
    return Fail("--block must be a positive multiple of 131072");
  }
  auto tier = kvtier::NvmeTier::Create(
      *geometry, {.path = path,
                  .capacity_bytes = size,
                  .queue_depth = static_cast<int>(depth),
                  .engine = engine == "thread_pool" ? kvtier::NvmeEngine::kThreadPool
                                                    : kvtier::NvmeEngine::kIoUring});
  if (!tier.ok()) return Fail(std::string(tier.status().message()));
  kvtier::NvmeTier& t = **tier;
  const int64_t slots = t.info().capacity_blocks;
  std::vector<kvtier::SlotId> readable;
  for (const kvtier::RecoveredBlock& r : t.recovered()) readable.push_back(r.slot);
  if (mode == "read" && readable.empty()) return Fail("nothing to read: run --mode=write first");

  std::vector<std::byte> src(static_cast<size_t>(block), std::byte{0x42});
  std::vector<std::vector<std::byte>> dst(static_cast<size_t>(depth),
                                          std::vector<std::byte>(static_cast<size_t>(block)));
  std::deque<kvtier::Completion> in_flight;
  int64_t done_blocks = 0, next = 0;
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(seconds);
  while (absl::Now() < end) {
    if (static_cast<int64_t>(in_flight.size()) == depth) {
      if (absl::Status s = in_flight.front().Wait(); !s.ok()) return Fail(s.ToString());
      in_flight.pop_front();
      ++done_blocks;
    }
    if (mode == "write") {
      const kvtier::SlotId slot(static_cast<uint32_t>(next % slots));
      in_flight.push_back(t.WriteBlock(slot, kvtier::BlockKey{7, slot.value()}, src));
    } else {
      const kvtier::SlotId slot = readable[static_cast<size_t>(next) % readable.size()];
      in_flight.push_back(t.ReadBlock(slot, kvtier::BlockKey{7, slot.value()},
                                      absl::MakeSpan(dst[static_cast<size_t>(next % depth)])));
    }
    ++next;
  }
  while (!in_flight.empty()) {
    if (absl::Status s = in_flight.front().Wait(); !s.ok()) return Fail(s.ToString());
    in_flight.pop_front();
    ++done_blocks;
  }
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("bytes_per_second=%.0f\n", static_cast<double>(done_blocks * block) / elapsed);
  return 0;
}
