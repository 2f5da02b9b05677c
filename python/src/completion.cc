// kvtier.Completion (completion.h): the outcome of an asynchronous operation. Python code makes
// one for ReportWritten (the kernel's completion, fired when the KV is written) and reads the
// ones Resume and tickets return. Waiting releases the GIL.
#include "kvtier/completion.h"

#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "bindings.h"

namespace kvtier::python {

void BindCompletion(py::module_& m) {
  py::class_<Completion>(m, "Completion",
                         "An asynchronous outcome. Completion() is pending until complete() fires "
                         "it; the first outcome wins.")
      .def(py::init<>())
      .def_static(
          "done_ok", [] { return Completion::Done(absl::OkStatus()); },
          "A completion that has already fired OK.")
      .def(
          "complete",
          [](const Completion& c, int code, const std::string& message) {
            // As the C ABI: a code outside absl's [0, 16] is refused, not fired as UNKNOWN.
            if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
              ThrowIfError(absl::InvalidArgumentError("complete: code " + std::to_string(code) +
                                                      " is not an absl status code (0-16)"));
            }
            return c.Complete(absl::Status(static_cast<absl::StatusCode>(code), message));
          },
          py::arg("code") = 0, py::arg("message") = "",
          "Fires with an absl status code (0: OK, the message then dropped) and message. False if "
          "it had already fired. Raises InvalidArgumentError for a code outside 0-16. Only for a "
          "completion you made (Completion()): one the cache hands out (a ticket's, a layer's, "
          "resume's) is the cache's to fire, and firing it ends its waits with blocks pending.")
      .def_property_readonly("done", &Completion::done)
      .def_property_readonly("ok", [](const Completion& c) { return c.done() && c.status().ok(); })
      .def_property_readonly(
          "error",
          [](const Completion& c) -> py::object {
            const absl::Status s = c.status();
            if (s.ok()) return py::none();
            return MakeErrorObject(s);
          },
          "None once fired OK; otherwise the kvtier.Error it fired with (UNAVAILABLE 'pending' "
          "while not fired).")
      .def(
          "wait",
          [](const Completion& c, std::optional<double> timeout_s) {
            const absl::Time deadline = DeadlineAfter(timeout_s);
            absl::Status s;
            {
              py::gil_scoped_release unlocked;
              s = c.WaitUntil(deadline);
            }
            ThrowIfError(std::move(s));
          },
          py::arg("timeout_s") = py::none(),
          "Blocks until fired (or timeout_s passes: DeadlineExceededError); raises the "
          "kvtier.Error it fired with, returns None if OK.");
}

}  // namespace kvtier::python
