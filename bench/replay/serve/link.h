// A link of the serving simulation (PCIe, NVMe, network): transfers in flight share its
// bandwidth equally (processor sharing), and each completes `latency` after its last byte
// crossed. Time is the simulation's, in seconds; nothing here reads a real clock.
//
// Processor sharing is how a DMA engine or a NIC serves concurrent copies to a first order;
// it does not model priorities, per-flow caps, or a drive's queue depth.
//
// Thread-safety: none; one simulation owns it.
#ifndef KVTIER_BENCH_REPLAY_SERVE_LINK_H_
#define KVTIER_BENCH_REPLAY_SERVE_LINK_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace kvtier::replay {

class Link {
 public:
  // bytes_per_second > 0, latency_seconds >= 0 (the caller validates).
  Link(std::string name, double bytes_per_second, double latency_seconds);

  // Starts a transfer of `bytes` (>= 0) at `now` (>= every time given before). `tag` is the
  // caller's, handed back on completion. Returns the transfer's id (> 0).
  int64_t Start(double now, double bytes, int64_t tag);
  // Stops transfer `id` at `now`: returns the fraction of its bytes that crossed, in [0, 1]
  // (1 if it already finished; -1 for an unknown id).
  double Cancel(int64_t id, double now);
  // When the next transfer completes: +inf when none is in flight.
  double NextCompletion() const;
  // When transfer `id` would complete if no other transfer started from now on (processor
  // sharing among those in flight, then the latency), as of the last time given; -1 for an
  // unknown id.
  double EstimatedCompletion(int64_t id) const;
  struct Done {
    int64_t id = 0;
    int64_t tag = 0;
  };
  // Advances to `now` and returns the transfers completed by then, in completion order.
  std::vector<Done> AdvanceTo(double now);

  const std::string& name() const { return name_; }
  double bytes_moved() const { return bytes_moved_; }
  // Seconds with at least one transfer moving bytes.
  double busy_seconds() const { return busy_seconds_; }
  int64_t in_flight() const { return static_cast<int64_t>(flows_.size() + draining_.size()); }

 private:
  struct Flow {
    int64_t id;
    int64_t tag;
    double bytes;
    double remaining;
  };
  struct Draining {
    int64_t id;
    int64_t tag;
    double done_at;
  };
  // Moves the flows' bytes forward to `now` (no flow finishes before it).
  void Progress(double now);
  // Progress to `now`, moving flows whose last byte crossed to draining_.
  void Settle(double now);
  double FlowFinish() const;  // when the first flow's last byte crosses at the current share

  std::string name_;
  double bandwidth_;
  double latency_;
  double now_ = 0;
  int64_t next_id_ = 1;
  std::vector<Flow> flows_;
  std::vector<Draining> draining_;
  double bytes_moved_ = 0;
  double busy_seconds_ = 0;
};

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_SERVE_LINK_H_
