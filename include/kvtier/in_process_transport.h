// InProcessTransport: a Transport over a map in this process, for tests and examples. Every
// call completes before it returns. Fault hooks let tests make it unavailable.
//
// Thread-safety: thread-safe.
#ifndef KVTIER_IN_PROCESS_TRANSPORT_H_
#define KVTIER_IN_PROCESS_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "kvtier/transport.h"

namespace kvtier {

class InProcessTransport final : public Transport {
 public:
  InProcessTransport();
  ~InProcessTransport() override;

  std::string name() const override { return "in_process"; }
  std::vector<Completion> Put(absl::Span<const TransportPut> items, absl::Time deadline) override;
  std::vector<Completion> Get(absl::Span<const TransportGet> items, absl::Time deadline) override;
  std::vector<Completion> Exists(absl::Span<const std::string> keys, absl::Time deadline) override;
  std::vector<Completion> Delete(absl::Span<const std::string> keys, absl::Time deadline) override;

  // Test hooks: every later call fails with `status` until it is set back to OK; and direct
  // access to a stored value, to corrupt it.
  void SetFailure(absl::Status status);
  std::vector<std::byte>* MutableValueForTest(const std::string& key);
  int64_t size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_IN_PROCESS_TRANSPORT_H_
