// The C ABI's residency tickets (EnsureResident, the device block table and pool, waits,
// release) and completions.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "capi/handles.h"

using namespace kvtier;  // NOLINT: the C entry points below spell every kvtier type
using kvtier::capi::Guard;
using kvtier::capi::Null;

namespace {

// kInvalidArgument unless a caller array of `capacity` entries holds `needed` of them.
absl::Status CheckCapacity(const char* call, size_t capacity, size_t needed) {
  if (capacity < needed) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": capacity ", capacity, " is below the ",
                                                   needed, " entries of the answer"));
  }
  return absl::OkStatus();
}

}  // namespace

extern "C" {

kvtier_status_code kvtier_ensure_resident(kvtier_cache* cache, uint64_t id, int64_t begin_token,
                                          int64_t end_token,
                                          const kvtier_residency_options* options,
                                          kvtier_ticket** out, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_ensure_resident";
    if (cache == nullptr) return Null(kCall, "cache");
    if (out == nullptr) return Null(kCall, "out");
    EnsureResidentOptions o;
    if (options != nullptr) {
      const int mode = capi::RawEnum(options->mode);
      if (mode < KVTIER_RESIDENCY_WAIT || mode > KVTIER_RESIDENCY_ASYNC) {
        return absl::InvalidArgumentError(
            absl::StrCat(kCall, ": mode ", mode, " is not one of 0..2"));
      }
      o.mode = static_cast<ResidencyMode>(mode);
      o.deadline = capi::DeadlineAfter(options->timeout_ns);
    }
    absl::StatusOr<ResidencyTicket> t =
        cache->cache->EnsureResident(SequenceId(id), begin_token, end_token, o);
    if (!t.ok()) return t.status();
    *out = new kvtier_ticket{std::move(*t)};
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_ticket_get_info(const kvtier_ticket* ticket, kvtier_ticket_info* out,
                                          kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_ticket_get_info";
    if (ticket == nullptr) return Null(kCall, "ticket");
    if (out == nullptr) return Null(kCall, "out");
    const ResidencyTicket& t = ticket->ticket;
    const DeviceBlockTable& table = t.block_table();
    out->id = t.id();
    out->sequence = t.sequence().value();
    out->begin_token = t.begin_token();
    out->end_token = t.end_token();
    out->first_block = table.first_block;
    out->num_blocks = static_cast<int32_t>(table.slots.size());
    out->tokens_per_block = table.tokens_per_block;
    out->tokens_in_last_block = table.tokens_in_last_block;
    out->resident_tokens = t.resident_tokens();
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_ticket_block_table(const kvtier_ticket* ticket, int32_t* slots,
                                             int32_t* logical_blocks, size_t capacity,
                                             size_t* num_blocks, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_ticket_block_table";
    if (ticket == nullptr) return Null(kCall, "ticket");
    if (num_blocks == nullptr) return Null(kCall, "num_blocks");
    const DeviceBlockTable& table = ticket->ticket.block_table();
    const size_t n = table.slots.size();
    *num_blocks = n;
    if (slots == nullptr && logical_blocks == nullptr && capacity == 0) return absl::OkStatus();
    if (absl::Status s = CheckCapacity(kCall, capacity, n); !s.ok()) return s;
    for (size_t i = 0; i < n; ++i) {
      if (slots != nullptr) slots[i] = table.slots[i];
      if (logical_blocks != nullptr) {
        logical_blocks[i] = table.first_block + static_cast<int32_t>(i);
      }
    }
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_ticket_block_status(const kvtier_ticket* ticket,
                                              kvtier_block_residency* status, size_t capacity,
                                              size_t* num_blocks, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_ticket_block_status";
    if (ticket == nullptr) return Null(kCall, "ticket");
    if (num_blocks == nullptr) return Null(kCall, "num_blocks");
    const std::vector<BlockResidency> residency = ticket->ticket.block_status();
    *num_blocks = residency.size();
    if (status == nullptr && capacity == 0) return absl::OkStatus();
    if (status == nullptr) return Null(kCall, "status");
    if (absl::Status s = CheckCapacity(kCall, capacity, residency.size()); !s.ok()) return s;
    for (size_t i = 0; i < residency.size(); ++i) {
      status[i] = static_cast<kvtier_block_residency>(residency[i]);
    }
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_ticket_block_error(const kvtier_ticket* ticket, size_t index,
                                             kvtier_error* cause, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_ticket_block_error";
    if (ticket == nullptr) return Null(kCall, "ticket");
    if (cause == nullptr) return Null(kCall, "cause");
    const size_t n = ticket->ticket.block_table().slots.size();
    if (index >= n) {
      return absl::OutOfRangeError(
          absl::StrCat(kCall, ": block ", index, " is outside the table of ", n));
    }
    capi::SetError(cause, ticket->ticket.block_error(static_cast<int64_t>(index)));
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_ticket_device_pool(const kvtier_ticket* ticket, kvtier_device_pool* pool,
                                             void** k_base, void** v_base, size_t layers_capacity,
                                             kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_ticket_device_pool";
    if (ticket == nullptr) return Null(kCall, "ticket");
    if (pool == nullptr) return Null(kCall, "pool");
    const DevicePoolView& view = ticket->ticket.block_table().pool;
    if (view.k_base.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(kCall, ": the HBM tier has no addresses (a metadata tier)"));
    }
    const size_t layers = view.k_base.size();
    pool->num_layers = static_cast<int32_t>(layers);
    pool->host_accessible = view.host_accessible;
    pool->block_stride_bytes = view.block_stride_bytes;
    pool->token_stride_bytes = view.token_stride_bytes;
    pool->head_stride_bytes = view.head_stride_bytes;
    if (k_base == nullptr && v_base == nullptr) return absl::OkStatus();
    if (absl::Status s = CheckCapacity(kCall, layers_capacity, layers); !s.ok()) return s;
    for (size_t l = 0; l < layers; ++l) {
      if (k_base != nullptr) k_base[l] = view.k_base[l];
      if (v_base != nullptr) v_base[l] = l < view.v_base.size() ? view.v_base[l] : nullptr;
    }
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_ticket_wait(const kvtier_ticket* ticket, int64_t timeout_ns,
                                      kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    if (ticket == nullptr) return Null("kvtier_ticket_wait", "ticket");
    return ticket->ticket.completion().WaitUntil(capi::DeadlineAfter(timeout_ns));
  });
}

kvtier_status_code kvtier_ticket_completion(const kvtier_ticket* ticket, kvtier_completion** out,
                                            kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_ticket_completion";
    if (ticket == nullptr) return Null(kCall, "ticket");
    if (out == nullptr) return Null(kCall, "out");
    *out = new kvtier_completion{ticket->ticket.completion()};
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_ticket_num_layers(const kvtier_ticket* ticket, int32_t* num_layers,
                                            kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_ticket_num_layers";
    if (ticket == nullptr) return Null(kCall, "ticket");
    if (num_layers == nullptr) return Null(kCall, "num_layers");
    *num_layers = ticket->ticket.num_layers();
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_ticket_wait_layer(const kvtier_ticket* ticket, int32_t layer,
                                            int64_t timeout_ns, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    if (ticket == nullptr) return Null("kvtier_ticket_wait_layer", "ticket");
    return ticket->ticket.layer_ready(layer).WaitUntil(capi::DeadlineAfter(timeout_ns));
  });
}

kvtier_status_code kvtier_ticket_layer_completion(const kvtier_ticket* ticket, int32_t layer,
                                                  kvtier_completion** out, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_ticket_layer_completion";
    if (ticket == nullptr) return Null(kCall, "ticket");
    if (out == nullptr) return Null(kCall, "out");
    *out = new kvtier_completion{ticket->ticket.layer_ready(layer)};
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_ticket_stream_wait(const kvtier_ticket* ticket, void* cuda_stream,
                                             int32_t layer, int64_t timeout_ns,
                                             kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    if (ticket == nullptr) return Null("kvtier_ticket_stream_wait", "ticket");
    return ticket->ticket.EnqueueStreamWait(cuda_stream, layer, capi::DeadlineAfter(timeout_ns));
  });
}

kvtier_status_code kvtier_release_ticket(kvtier_cache* cache, const kvtier_ticket* ticket,
                                         kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_release_ticket";
    if (cache == nullptr) return Null(kCall, "cache");
    if (ticket == nullptr) return Null(kCall, "ticket");
    return cache->cache->ReleaseTicket(ticket->ticket);
  });
}

void kvtier_ticket_destroy(kvtier_ticket* ticket) { delete ticket; }

kvtier_status_code kvtier_completion_create(kvtier_completion** out, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    if (out == nullptr) return Null("kvtier_completion_create", "out");
    *out = new kvtier_completion{Completion(), /*caller_fires=*/true};
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_completion_complete(const kvtier_completion* completion,
                                              kvtier_status_code code, const char* message,
                                              bool* fired, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_completion_complete";
    if (completion == nullptr) return Null(kCall, "completion");
    if (!completion->caller_fires) {
      return absl::FailedPreconditionError(absl::StrCat(
          kCall,
          ": the cache fires this completion (only one from kvtier_completion_create is "
          "the caller's to fire)"));
    }
    const int raw = capi::RawEnum(code);
    if (raw < KVTIER_OK || raw > KVTIER_UNAUTHENTICATED) {
      return absl::InvalidArgumentError(
          absl::StrCat(kCall, ": code ", raw, " is not a status code"));
    }
    const bool first = completion->completion.Complete(
        absl::Status(static_cast<absl::StatusCode>(raw), message == nullptr ? "" : message));
    if (fired != nullptr) *fired = first;
    return absl::OkStatus();
  });
}

bool kvtier_completion_done(const kvtier_completion* completion) {
  return completion != nullptr && completion->completion.done();
}

kvtier_status_code kvtier_completion_wait(const kvtier_completion* completion, int64_t timeout_ns,
                                          kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    if (completion == nullptr) return Null("kvtier_completion_wait", "completion");
    return completion->completion.WaitUntil(capi::DeadlineAfter(timeout_ns));
  });
}

void kvtier_completion_destroy(kvtier_completion* completion) { delete completion; }

kvtier_status_code kvtier_completion_from_cuda_event(kvtier_cache* cache, void* cuda_event,
                                                     kvtier_completion** out,
                                                     kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_completion_from_cuda_event";
    if (cache == nullptr) return Null(kCall, "cache");
    if (out == nullptr) return Null(kCall, "out");
    absl::StatusOr<Completion> c = cache->cache->CompletionOfCudaEvent(cuda_event);
    if (!c.ok()) return c.status();
    *out = new kvtier_completion{*std::move(c)};
    return absl::OkStatus();
  });
}

}  // extern "C"
