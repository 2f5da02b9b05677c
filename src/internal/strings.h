// Bridges std::string_view (kvtier's public headers) and absl::string_view. Debian's abseil is
// built with ABSL_OPTION_USE_STD_STRING_VIEW=0, so the two are distinct types with no conversion.
#ifndef KVTIER_INTERNAL_STRINGS_H_
#define KVTIER_INTERNAL_STRINGS_H_

#include <string_view>

#include "absl/strings/string_view.h"

namespace kvtier::internal {

inline absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string_view ToStd(absl::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace kvtier::internal

#endif  // KVTIER_INTERNAL_STRINGS_H_
