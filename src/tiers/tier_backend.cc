// TierBackend (tier_backend.h): names of tiers and the interface's default hooks.
#include "kvtier/tier_backend.h"

#include <vector>

namespace kvtier {

std::vector<Completion> TierBackend::WriteBlocks(absl::Span<const BlockWrite> writes,
                                                 const BlockIoOptions& options) {
  std::vector<Completion> out;
  out.reserve(writes.size());
  for (const BlockWrite& w : writes) {
    if (w.layers == nullptr) {
      out.push_back(WriteBlock(w.slot, w.key, w.src, options));
      continue;
    }
    BlockIoOptions own = options;
    own.layers = w.layers;
    out.push_back(WriteBlock(w.slot, w.key, w.src, own));
  }
  return out;
}

std::vector<Completion> TierBackend::ReadBlocks(absl::Span<const BlockRead> reads,
                                                const BlockIoOptions& options) {
  std::vector<Completion> out;
  out.reserve(reads.size());
  for (const BlockRead& r : reads) out.push_back(ReadBlock(r.slot, r.key, r.dst, options));
  return out;
}

}  // namespace kvtier
