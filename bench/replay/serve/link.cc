// Processor sharing (link.h).
#include "bench/replay/serve/link.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace kvtier::replay {
namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
// Bytes below this count as crossed: the time steps are differences of doubles.
constexpr double kEpsilonBytes = 1e-6;
}  // namespace

Link::Link(std::string name, double bytes_per_second, double latency_seconds)
    : name_(std::move(name)), bandwidth_(bytes_per_second), latency_(latency_seconds) {}

double Link::FlowFinish() const {
  if (flows_.empty()) return kInf;
  double least = kInf;
  for (const Flow& f : flows_) least = std::min(least, f.remaining);
  return now_ + least * static_cast<double>(flows_.size()) / bandwidth_;
}

void Link::Progress(double now) {
  if (now <= now_) return;
  if (!flows_.empty()) {
    const double share = (now - now_) * bandwidth_ / static_cast<double>(flows_.size());
    for (Flow& f : flows_) {
      const double moved = std::min(share, f.remaining);
      f.remaining -= moved;
      bytes_moved_ += moved;
    }
    busy_seconds_ += now - now_;
  }
  now_ = now;
}

double Link::EstimatedCompletion(int64_t id) const {
  for (const Draining& d : draining_) {
    if (d.id == id) return d.done_at;
  }
  double mine = -1;
  for (const Flow& f : flows_) {
    if (f.id == id) mine = f.remaining;
  }
  if (mine < 0) return -1;
  // Under processor sharing the flows finish smallest first; each interval between finishes
  // moves (flows left) x (the next remainder's increment).
  std::vector<double> left;
  left.reserve(flows_.size());
  for (const Flow& f : flows_) left.push_back(f.remaining);
  std::sort(left.begin(), left.end());
  double t = now_, done = 0;
  for (size_t k = 0; k < left.size() && done < mine; ++k) {
    const double step = std::min(left[k], mine) - done;
    t += step * static_cast<double>(left.size() - k) / bandwidth_;
    done += step;
  }
  return t + latency_;
}

int64_t Link::Start(double now, double bytes, int64_t tag) {
  Settle(now);
  const int64_t id = next_id_++;
  if (bytes <= kEpsilonBytes) {
    draining_.push_back({id, tag, now_ + latency_});
  } else {
    flows_.push_back({id, tag, bytes, bytes});
  }
  return id;
}

double Link::Cancel(int64_t id, double now) {
  Settle(now);
  for (size_t i = 0; i < flows_.size(); ++i) {
    if (flows_[i].id != id) continue;
    const double fraction = 1.0 - flows_[i].remaining / flows_[i].bytes;
    flows_.erase(flows_.begin() + static_cast<std::ptrdiff_t>(i));
    return std::clamp(fraction, 0.0, 1.0);
  }
  for (size_t i = 0; i < draining_.size(); ++i) {
    if (draining_[i].id != id) continue;
    draining_.erase(draining_.begin() + static_cast<std::ptrdiff_t>(i));
    return 1.0;
  }
  return -1.0;
}

double Link::NextCompletion() const {
  double next = FlowFinish();
  if (next < kInf) next += latency_;
  for (const Draining& d : draining_) next = std::min(next, d.done_at);
  return next;
}

void Link::Settle(double now) {
  // Flows finish one at a time: each finish raises the others' share. Each round moves every
  // flow by the least remaining bytes, so it ends at least one flow even where the finish time
  // rounds to now_ (no loop on floating-point residue).
  while (!flows_.empty()) {
    double least = flows_.front().remaining;
    for (const Flow& f : flows_) least = std::min(least, f.remaining);
    const double finish = now_ + least * static_cast<double>(flows_.size()) / bandwidth_;
    if (finish > now) break;
    for (Flow& f : flows_) f.remaining -= least;
    bytes_moved_ += least * static_cast<double>(flows_.size());
    busy_seconds_ += std::max(0.0, finish - now_);
    now_ = std::max(now_, finish);
    const double done_below = least * 1e-9 + kEpsilonBytes;
    for (size_t i = 0; i < flows_.size();) {
      if (flows_[i].remaining <= done_below) {
        bytes_moved_ += flows_[i].remaining;
        draining_.push_back({flows_[i].id, flows_[i].tag, now_ + latency_});
        flows_.erase(flows_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  Progress(now);
}

std::vector<Link::Done> Link::AdvanceTo(double now) {
  Settle(now);
  std::vector<Done> done;
  std::stable_sort(draining_.begin(), draining_.end(),
                   [](const Draining& a, const Draining& b) { return a.done_at < b.done_at; });
  size_t n = 0;
  while (n < draining_.size() && draining_[n].done_at <= now) {
    done.push_back({draining_[n].id, draining_[n].tag});
    ++n;
  }
  draining_.erase(draining_.begin(), draining_.begin() + static_cast<std::ptrdiff_t>(n));
  return done;
}

}  // namespace kvtier::replay
