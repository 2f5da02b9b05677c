// The C ABI's status boundary: absl::Status into kvtier_error, code names, and the argument
// checks every entry point shares.
#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "capi/handles.h"

namespace kvtier::capi {

// The enum mirrors absl::StatusCode number for number; a change on either side breaks this.
static_assert(KVTIER_OK == static_cast<int>(absl::StatusCode::kOk));
static_assert(KVTIER_INVALID_ARGUMENT == static_cast<int>(absl::StatusCode::kInvalidArgument));
static_assert(KVTIER_NOT_FOUND == static_cast<int>(absl::StatusCode::kNotFound));
static_assert(KVTIER_RESOURCE_EXHAUSTED == static_cast<int>(absl::StatusCode::kResourceExhausted));
static_assert(KVTIER_FAILED_PRECONDITION ==
              static_cast<int>(absl::StatusCode::kFailedPrecondition));
static_assert(KVTIER_OUT_OF_RANGE == static_cast<int>(absl::StatusCode::kOutOfRange));
static_assert(KVTIER_UNAVAILABLE == static_cast<int>(absl::StatusCode::kUnavailable));
static_assert(KVTIER_DATA_LOSS == static_cast<int>(absl::StatusCode::kDataLoss));
static_assert(KVTIER_UNAUTHENTICATED == static_cast<int>(absl::StatusCode::kUnauthenticated));
// And the other enums mirror theirs.
static_assert(KVTIER_NUM_TIERS == kNumTiers);
static_assert(KVTIER_TIER_REMOTE == TierIndex(Tier::kRemote));
static_assert(KVTIER_DTYPE_FP8_E5M2 == static_cast<int>(KvDtype::kFp8E5m2));
static_assert(KVTIER_HBM_BLOCK_FIRST == static_cast<int>(HbmLayout::kBlockFirst));
static_assert(KVTIER_HBM_LAYER_KV_SPLIT == static_cast<int>(HbmLayout::kLayerKvSplit));
static_assert(KVTIER_HBM_EMULATED == static_cast<int>(HbmBackend::kEmulated));
static_assert(KVTIER_HBM_CUDA == static_cast<int>(HbmBackend::kCuda));
static_assert(KVTIER_CODEC_FP8_E4M3 == static_cast<int>(Codec::kFp8E4m3));
static_assert(KVTIER_STOP_LENGTH == static_cast<int>(StopReason::kLength));
static_assert(KVTIER_HINT_REJECTED == static_cast<int>(HintOutcome::Result::kRejected));
static_assert(KVTIER_RESIDENCY_ASYNC == static_cast<int>(ResidencyMode::kAsync));
static_assert(KVTIER_BLOCK_NOT_RESIDENT == static_cast<int>(BlockResidency::kNotResident));
static_assert(KVTIER_EVENT_REMOVED == static_cast<int>(CacheEventKind::kRemoved));
static_assert(KVTIER_EVENT_ALL_CLEARED == static_cast<int>(CacheEventKind::kAllCleared));
static_assert(KVTIER_ROOM_WAIT == static_cast<int>(RoomWait::kWait));
static_assert(KVTIER_ROOM_NEVER == static_cast<int>(RoomWait::kNever));

void CopyText(absl::string_view text, char* dst, size_t capacity) {
  if (dst == nullptr || capacity == 0) return;
  const size_t n = std::min(text.size(), capacity - 1);
  if (n > 0) std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

kvtier_status_code SetError(kvtier_error* error, const absl::Status& status) {
  const auto code = static_cast<kvtier_status_code>(status.code());
  if (error != nullptr) {
    error->code = code;
    CopyText(status.message(), error->message, sizeof(error->message));
  }
  return code;
}

absl::Status Null(const char* call, const char* what) {
  return absl::InvalidArgumentError(absl::StrCat(call, ": ", what, " is null"));
}

absl::StatusOr<absl::Span<const int32_t>> Tokens(const char* call, const int32_t* tokens,
                                                 size_t n) {
  if (tokens == nullptr && n > 0) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": tokens is null with num_tokens ", n));
  }
  return absl::Span<const int32_t>(tokens, n);
}

void ToHintOutcome(const HintOutcome& in, kvtier_hint_outcome* out) {
  if (out == nullptr) return;
  out->result = static_cast<kvtier_hint_result>(in.result);
  out->blocks = in.blocks;
  CopyText(absl::string_view(in.reason.data(), in.reason.size()), out->reason, sizeof(out->reason));
}

}  // namespace kvtier::capi

extern "C" {

uint32_t kvtier_c_abi_version(void) { return KVTIER_C_ABI_VERSION; }

const char* kvtier_status_code_name(kvtier_status_code code) {
  switch (kvtier::capi::RawEnum(code)) {
    case KVTIER_OK:
      return "OK";
    case KVTIER_CANCELLED:
      return "CANCELLED";
    case KVTIER_UNKNOWN:
      return "UNKNOWN";
    case KVTIER_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case KVTIER_DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case KVTIER_NOT_FOUND:
      return "NOT_FOUND";
    case KVTIER_ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case KVTIER_PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case KVTIER_RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case KVTIER_FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case KVTIER_ABORTED:
      return "ABORTED";
    case KVTIER_OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case KVTIER_UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case KVTIER_INTERNAL:
      return "INTERNAL";
    case KVTIER_UNAVAILABLE:
      return "UNAVAILABLE";
    case KVTIER_DATA_LOSS:
      return "DATA_LOSS";
    case KVTIER_UNAUTHENTICATED:
      return "UNAUTHENTICATED";
  }
  return "UNKNOWN_CODE";
}

const char* kvtier_tier_name(kvtier_tier tier) {
  switch (kvtier::capi::RawEnum(tier)) {
    case KVTIER_TIER_HBM:
      return "hbm";
    case KVTIER_TIER_DRAM:
      return "dram";
    case KVTIER_TIER_NVME:
      return "nvme";
    case KVTIER_TIER_REMOTE:
      return "remote";
  }
  return "unknown";
}

}  // extern "C"
