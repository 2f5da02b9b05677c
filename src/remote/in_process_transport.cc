// InProcessTransport (in_process_transport.h): a map as a Transport, with fault hooks.
#include "kvtier/in_process_transport.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "internal/mutex.h"
#include "remote/transport_items.h"

namespace kvtier {

struct InProcessTransport::Impl {
  internal::Mutex mu;
  absl::flat_hash_map<std::string, std::vector<std::byte>> values ABSL_GUARDED_BY(mu);
  absl::Status failure ABSL_GUARDED_BY(mu);

  // Runs `op` per item unless the transport is failing or the deadline has passed.
  template <typename Item, typename Op>
  std::vector<Completion> Each(absl::Span<const Item> items, absl::Time deadline, Op op) {
    std::vector<Completion> out;
    out.reserve(items.size());
    internal::MutexLock lock(&mu);
    for (const Item& item : items) {
      if (!failure.ok()) {
        out.push_back(Completion::Done(failure));
      } else if (absl::Now() > deadline) {
        out.push_back(Completion::Done(absl::DeadlineExceededError("in_process: deadline passed")));
      } else {
        out.push_back(Completion::Done(op(item)));
      }
    }
    return out;
  }
};

InProcessTransport::InProcessTransport() : impl_(std::make_unique<Impl>()) {}
InProcessTransport::~InProcessTransport() = default;

std::vector<Completion> InProcessTransport::Put(absl::Span<const TransportPut> items,
                                                absl::Time deadline) {
  return impl_->Each(items, deadline, [this](const TransportPut& p) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (p.if_absent && impl_->values.contains(p.key)) {
      return absl::AlreadyExistsError(absl::StrCat("in_process: ", p.key, " exists"));
    }
    std::vector<std::byte>& stored = impl_->values[p.key];
    stored.assign(p.value_prefix.begin(), p.value_prefix.end());
    stored.insert(stored.end(), p.value.begin(), p.value.end());
    return absl::OkStatus();
  });
}

std::vector<Completion> InProcessTransport::Get(absl::Span<const TransportGet> items,
                                                absl::Time deadline) {
  return impl_->Each(items, deadline, [this](const TransportGet& g) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (absl::Status s = internal::CheckGetItem(g, "in_process"); !s.ok()) return s;
    auto it = impl_->values.find(g.key);
    if (it == impl_->values.end()) {
      return absl::NotFoundError(absl::StrCat("in_process: no value at ", g.key));
    }
    return internal::DeliverValue(g, it->second, "in_process");
  });
}

std::vector<Completion> InProcessTransport::Exists(absl::Span<const std::string> keys,
                                                   absl::Time deadline) {
  return impl_->Each(keys, deadline, [this](const std::string& k) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return impl_->values.contains(k)
               ? absl::OkStatus()
               : absl::NotFoundError(absl::StrCat("in_process: no value at ", k));
  });
}

std::vector<Completion> InProcessTransport::Delete(absl::Span<const std::string> keys,
                                                   absl::Time deadline) {
  return impl_->Each(keys, deadline, [this](const std::string& k) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return impl_->values.erase(k) == 1
               ? absl::OkStatus()
               : absl::NotFoundError(absl::StrCat("in_process: no value at ", k));
  });
}

void InProcessTransport::SetFailure(absl::Status status) {
  internal::MutexLock lock(&impl_->mu);
  impl_->failure = std::move(status);
}

std::vector<std::byte>* InProcessTransport::MutableValueForTest(const std::string& key) {
  internal::MutexLock lock(&impl_->mu);
  auto it = impl_->values.find(key);
  return it == impl_->values.end() ? nullptr : &it->second;
}

int64_t InProcessTransport::size() const {
  internal::MutexLock lock(&impl_->mu);
  return static_cast<int64_t>(impl_->values.size());
}

}  // namespace kvtier
