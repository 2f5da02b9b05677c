// The pieces of the `kvtier._kvtier` extension module (pybind11), one file per concept of the
// public C++ API, and the one rule they share: an absl::Status that is not OK becomes a Python
// exception (kvtier.Error or its subclass for the code, status.h below), never a return value.
//
// The module uses only include/kvtier/ (the public API), as any other client does. Every call
// into KvCache releases the GIL: none of them touches a Python object, and several may block
// (Append and Resume up to room_wait, EnsureResident in kWait, remote discovery's probe).
#ifndef KVTIER_PYTHON_SRC_BINDINGS_H_
#define KVTIER_PYTHON_SRC_BINDINGS_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvtier::python {

namespace py = pybind11;

// Thrown by the bindings for a non-OK status; the translator registered by BindErrors raises
// the kvtier.Error subclass for its code, with attributes code (int), code_name
// ("NOT_FOUND") and message.
class StatusError : public std::exception {
 public:
  explicit StatusError(absl::Status status);
  const absl::Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  absl::Status status_;
  std::string what_;
};

inline void ThrowIfError(absl::Status status) {
  if (!status.ok()) throw StatusError(std::move(status));
}

template <typename T>
T Unwrap(absl::StatusOr<T> value) {
  if (!value.ok()) throw StatusError(std::move(value).status());
  return *std::move(value);
}

// The Python exception object for `status` (an instance of kvtier.Error's subclass for its
// code), for APIs that report a status without failing (ResidencyTicket.block_error).
py::object MakeErrorObject(const absl::Status& status);

// Seconds as Python floats; None for "none given". Errors: kInvalidArgument for NaN.
absl::Duration SecondsToDuration(double seconds);
std::optional<absl::Duration> OptionalSeconds(const std::optional<double>& seconds);
// now + timeout; InfiniteFuture for None or +inf.
absl::Time DeadlineAfter(const std::optional<double>& timeout_s);

// The binders, each in its own file, called in this order by the module's init (module.cc).
void BindErrors(py::module_& m);      // errors.cc
void BindGeometry(py::module_& m);    // geometry.cc: enums, KvGeometry, CacheNamespace
void BindTierStack(py::module_& m);   // tier_stack.cc
void BindResults(py::module_& m);     // results.cc: the plain result structs, stats, events
void BindCompletion(py::module_& m);  // completion.cc
void BindHbmPool(py::module_& m);     // hbm_pool.cc
void BindKvCache(py::module_& m);     // kv_cache.cc: KvCache and ResidencyTicket

}  // namespace kvtier::python

#endif  // KVTIER_PYTHON_SRC_BINDINGS_H_
