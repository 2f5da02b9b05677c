// kvtier.Error and one subclass per absl status code, and the translation of StatusError into
// them. An exception carries `code` (the absl::StatusCode number), `code_name` (its canonical
// name, "NOT_FOUND") and `message` (the status message); str() is absl's "NOT_FOUND: message".
#include <Python.h>

#include <array>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "bindings.h"

namespace kvtier::python {
namespace {

// Canonical codes 0..16; the Python class name of each (OK has none).
constexpr int kNumCodes = 17;
constexpr std::array<const char*, kNumCodes> kClassNames = {
    nullptr,
    "CancelledError",
    "UnknownError",
    "InvalidArgumentError",
    "DeadlineExceededError",
    "NotFoundError",
    "AlreadyExistsError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "FailedPreconditionError",
    "AbortedError",
    "OutOfRangeError",
    "UnimplementedError",
    "InternalError",
    "UnavailableError",
    "DataLossError",
    "UnauthenticatedError",
};

// Owned for the life of the process: the module's classes are never unloaded.
PyObject* g_error = nullptr;
std::array<PyObject*, kNumCodes> g_classes{};

PyObject* ClassFor(absl::StatusCode code) {
  const int n = static_cast<int>(code);
  if (n > 0 && n < kNumCodes && g_classes[static_cast<size_t>(n)] != nullptr) {
    return g_classes[static_cast<size_t>(n)];
  }
  return g_error;  // a code absl may add later
}

}  // namespace

StatusError::StatusError(absl::Status status)
    : status_(std::move(status)), what_(status_.ToString()) {}

py::object MakeErrorObject(const absl::Status& status) {
  py::handle cls(ClassFor(status.code()));
  py::object exc = cls(status.ToString());
  exc.attr("code") = static_cast<int>(status.code());
  exc.attr("code_name") = absl::StatusCodeToString(status.code());
  exc.attr("message") = std::string(status.message());
  return exc;
}

absl::Duration SecondsToDuration(double seconds) {
  if (std::isnan(seconds)) {
    throw StatusError(absl::InvalidArgumentError("a duration in seconds is NaN"));
  }
  if (std::isinf(seconds)) {
    return seconds > 0 ? absl::InfiniteDuration() : -absl::InfiniteDuration();
  }
  return absl::Seconds(seconds);
}

std::optional<absl::Duration> OptionalSeconds(const std::optional<double>& seconds) {
  if (!seconds.has_value()) return std::nullopt;
  return SecondsToDuration(*seconds);
}

absl::Time DeadlineAfter(const std::optional<double>& timeout_s) {
  if (!timeout_s.has_value()) return absl::InfiniteFuture();
  const absl::Duration timeout = SecondsToDuration(*timeout_s);
  if (timeout == absl::InfiniteDuration()) return absl::InfiniteFuture();
  return absl::Now() + timeout;
}

void BindErrors(py::module_& m) {
  g_error = PyErr_NewExceptionWithDoc(
      "kvtier._kvtier.Error",
      "A kvtier call failed. Attributes: code (the absl::StatusCode number), code_name (its "
      "canonical name, e.g. 'NOT_FOUND') and message. Each code has a subclass "
      "(kvtier.NotFoundError, ...).",
      PyExc_Exception, nullptr);
  if (g_error == nullptr) throw py::error_already_set();
  m.add_object("Error", py::handle(g_error));
  for (int n = 1; n < kNumCodes; ++n) {
    const std::string qualified =
        absl::StrCat("kvtier._kvtier.", kClassNames[static_cast<size_t>(n)]);
    const std::string doc =
        absl::StrCat("kvtier.Error with code ", n, " (",
                     absl::StatusCodeToString(static_cast<absl::StatusCode>(n)), ").");
    PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc.c_str(), g_error, nullptr);
    if (cls == nullptr) throw py::error_already_set();
    g_classes[static_cast<size_t>(n)] = cls;
    m.add_object(kClassNames[static_cast<size_t>(n)], py::handle(cls));
  }
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object exc = MakeErrorObject(e.status());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });
  // Lets Python code (and tests) build the exception for a code: error_class(5) is NotFoundError.
  m.def(
      "error_class",
      [](int code) {
        return py::reinterpret_borrow<py::object>(ClassFor(static_cast<absl::StatusCode>(code)));
      },
      py::arg("code"), "The kvtier.Error subclass raised for an absl status code number.");
}

}  // namespace kvtier::python
