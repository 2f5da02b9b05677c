// kvtier.KvCache and kvtier.ResidencyTicket (kv_cache.h) in Python form. Sequence ids are
// ints (uint64), tokens any 1-D sequence of integers that fit int32 (a list, a numpy array of an
// integer dtype: int32 arrays are read in place; floats and values past int32 raise
// InvalidArgumentError), durations float seconds, deadlines a timeout in seconds from the call.
// Every call releases the GIL while the cache runs. Errors raise the kvtier.Error subclass of
// the status code kv_cache.h documents for the call.
#include "kvtier/kv_cache.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <array>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "bindings.h"
#include "objects.h"

namespace kvtier::python {
namespace {

using Tokens = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

// Token ids as int32, into `ids` (which holds them while the span is read). An integer array or
// sequence whose values all fit int32; anything else is InvalidArgumentError, never a lossy cast
// (a float truncated, 2**32 + 5 wrapped to 5): two prompts made equal by a cast would share KV.
absl::Span<const int32_t> TokenSpan(const py::object& tokens, Tokens& ids) {
  const py::array a = py::array::ensure(tokens);
  if (!a) {
    throw StatusError(absl::InvalidArgumentError(
        "tokens must be a one-dimensional array or sequence of integer token ids"));
  }
  if (a.ndim() != 1) {
    throw StatusError(absl::InvalidArgumentError("tokens must be one-dimensional, got " +
                                                 std::to_string(a.ndim()) + " dimensions"));
  }
  if (a.size() == 0) return {};  // no token to read, whatever the dtype ([] is float64)
  const char kind = a.dtype().kind();
  if (kind != 'i' && kind != 'u') {
    throw StatusError(absl::InvalidArgumentError("tokens must be integer token ids, got dtype " +
                                                 std::string(py::str(a.dtype()))));
  }
  if (a.itemsize() > 4 || (kind == 'u' && a.itemsize() == 4)) {
    const py::object lo = a.attr("min")();
    const py::object hi = a.attr("max")();
    if (lo < py::int_(std::numeric_limits<int32_t>::min()) ||
        hi > py::int_(std::numeric_limits<int32_t>::max())) {
      throw StatusError(absl::InvalidArgumentError("token ids must fit int32, got values from " +
                                                   std::string(py::str(lo)) + " to " +
                                                   std::string(py::str(hi))));
    }
  }
  ids = Tokens(a);  // an integer cast that cannot lose a value now; throws with numpy's error
  return absl::MakeConstSpan(ids.data(), static_cast<size_t>(ids.size()));
}

// The identity extras (and, for CreateSequence, the retention and session) of a sequence.
SequenceOptions Identity(std::optional<AdapterIdentity> adapter,
                         std::optional<std::string> tenant_salt,
                         std::vector<MultimodalItem> multimodal) {
  SequenceOptions o;
  o.adapter = std::move(adapter);
  o.tenant_salt = std::move(tenant_salt);
  o.multimodal = std::move(multimodal);
  return o;
}

// Runs `f` with the GIL released.
template <typename F>
auto Unlocked(F&& f) {
  py::gil_scoped_release unlocked;
  return f();
}

KvCache& Cache(const PyKvCache& c) { return *c.cache; }

// The identity keyword arguments shared by lookup, prefetch, retain and invalidate.
#define KVTIER_PY_IDENTITY_ARGS                                                        \
  py::kw_only(), py::arg("adapter") = py::none(), py::arg("tenant_salt") = py::none(), \
                 py::arg("multimodal") = std::vector<MultimodalItem> {}

using OptAdapter = std::optional<AdapterIdentity>;
using OptSalt = std::optional<std::string>;
using Items = std::vector<MultimodalItem>;

void ReleaseTicket(PyTicket& t) {
  if (t.released) {
    throw StatusError(absl::FailedPreconditionError(
        "ReleaseTicket: ticket " + std::to_string(t.ticket.id()) + " was released before"));
  }
  ThrowIfError(Unlocked([&] { return t.cache->ReleaseTicket(t.ticket); }));
  t.released = true;  // only once it is: a failed release can be retried
}

void BindHashedPrompt(py::module_& m) {
  py::class_<HashedPrompt>(m, "HashedPrompt",
                           "A prompt with its full blocks' keys (KvCache.hash_prompt). Immutable.")
      .def_property_readonly("tokens",
                             [](const HashedPrompt& p) {
                               const auto t = p.tokens();
                               return py::array_t<int32_t>(static_cast<py::ssize_t>(t.size()),
                                                           t.data());
                             })
      .def_property_readonly("keys", [](const HashedPrompt& p) {
        std::vector<std::string> keys;
        for (const BlockKey& k : p.keys()) keys.push_back(k.ToHex());
        return keys;
      });
}

void BindTicket(py::module_& m) {
  py::class_<PyTicket>(m, "ResidencyTicket",
                       "The outcome of KvCache.ensure_resident: the range's blocks pinned in HBM "
                       "until release() (or the end of a with block, or the object's death).")
      .def_property_readonly("id", [](const PyTicket& t) { return t.ticket.id(); })
      .def_property_readonly("sequence",
                             [](const PyTicket& t) { return t.ticket.sequence().value(); })
      .def_property_readonly("begin_token",
                             [](const PyTicket& t) { return t.ticket.begin_token(); })
      .def_property_readonly("end_token", [](const PyTicket& t) { return t.ticket.end_token(); })
      .def_property_readonly(
          "block_table",
          [](const PyTicket& t) {
            const std::vector<int32_t>& slots = t.ticket.block_table().slots;
            py::array_t<int32_t> out(static_cast<py::ssize_t>(slots.size()));
            std::copy(slots.begin(), slots.end(), out.mutable_data());
            return out;
          },
          "HBM slot of each logical block of the range (int32; -1: not resident, recompute it). "
          "A copy, taken now: for ASYNC, final once the completion has fired.")
      .def_property_readonly("first_block",
                             [](const PyTicket& t) { return t.ticket.block_table().first_block; })
      .def_property_readonly(
          "tokens_per_block",
          [](const PyTicket& t) { return t.ticket.block_table().tokens_per_block; })
      .def_property_readonly(
          "tokens_in_last_block",
          [](const PyTicket& t) { return t.ticket.block_table().tokens_in_last_block; })
      .def_property_readonly("block_status",
                             [](const PyTicket& t) { return t.ticket.block_status(); })
      .def(
          "block_error",
          [](const PyTicket& t, int64_t index) -> py::object {
            const absl::Status s = t.ticket.block_error(index);
            if (s.ok()) return py::none();
            // A bad index is the caller's error: raised, not returned as a block's cause.
            if (index < 0 || index >= static_cast<int64_t>(t.ticket.block_status().size())) {
              ThrowIfError(s);
            }
            return MakeErrorObject(s);
          },
          py::arg("index"),
          "None for a resident block; the kvtier.Error of its cause otherwise. Raises "
          "OutOfRangeError for an index outside the ticket's blocks.")
      .def_property_readonly("resident_tokens",
                             [](const PyTicket& t) { return t.ticket.resident_tokens(); })
      .def_property_readonly("completion", [](const PyTicket& t) { return t.ticket.completion(); })
      .def_property_readonly("num_layers", [](const PyTicket& t) { return t.ticket.num_layers(); })
      .def(
          "layer_ready", [](const PyTicket& t, int layer) { return t.ticket.layer_ready(layer); },
          py::arg("layer"),
          "The kvtier.Completion of layer `layer`: fires once that layer of every block of the "
          "range is in HBM (later layers may still be in transfer), so its attention can run; "
          "block_table is final for it then. A layer outside [0, num_layers) gives one that has "
          "fired OutOfRangeError.")
      .def(
          "stream_wait",
          [](const PyTicket& t, uintptr_t cuda_stream, int layer, std::optional<double> timeout_s) {
            const absl::Time deadline = DeadlineAfter(timeout_s);
            absl::Status s;
            {
              py::gil_scoped_release unlocked;
              s = t.ticket.EnqueueStreamWait(reinterpret_cast<void*>(cuda_stream), layer, deadline);
            }
            ThrowIfError(std::move(s));
          },
          py::arg("cuda_stream") = 0, py::arg("layer") = ResidencyTicket::kAllLayers,
          py::arg("timeout_s") = py::none(),
          "Makes the CUDA stream (an address, e.g. torch.cuda.current_stream().cuda_stream; 0: "
          "the default stream) wait on the GPU for layer `layer` (-1: every layer) without a "
          "host wait for the copies; on the emulated HBM it waits on the host until the layer "
          "has landed. Raises UnavailableError for a block that cannot be made resident.")
      .def_property_readonly("released", [](const PyTicket& t) { return t.released; })
      .def("release", &ReleaseTicket,
           "Unpins the ticket's blocks. FailedPreconditionError for a second release.")
      .def("__enter__", [](py::object self) { return self; })
      .def(
          "__exit__",
          [](PyTicket& t, const py::object&, const py::object&, const py::object&) {
            if (!t.released) ReleaseTicket(t);
            return false;
          },
          py::arg("exc_type"), py::arg("exc"), py::arg("traceback"));
}

}  // namespace

void BindKvCache(py::module_& m) {
  BindHashedPrompt(m);
  BindTicket(m);

  py::class_<PyKvCache>(
      m, "KvCache",
      "The API an inference server links (kv_cache.h): sequences, prefix attach, residency "
      "tickets with device block tables, hints, stats and events. Thread-safe.")
      .def_static(
          "create",
          [](const CacheNamespace& ns, PyTierStack& stack, std::string eviction_policy,
             HashAlgorithm hash, WritePolicy write_policy, TierInclusion inclusion,
             std::array<int, kNumTiers> admit_after_uses, bool demote_on_evict,
             double prefill_flops_per_second, bool measure_bandwidth, int64_t event_buffer,
             double room_wait_s, int bounce_buffers, int remote_probe_window_blocks,
             double remote_probe_timeout_s, std::string worker_id, bool demote_by_value) {
            if (stack.consumed) {
              throw StatusError(absl::FailedPreconditionError(
                  "KvCache.create: this TierStack's backends were taken by another cache"));
            }
            KvCacheOptions o;
            o.hash = hash;
            o.eviction_policy = std::move(eviction_policy);
            o.write_policy = write_policy;
            o.inclusion = inclusion;
            o.admit_after_uses = admit_after_uses;
            o.demote_on_evict = demote_on_evict;
            o.demote_by_value = demote_by_value;
            o.prefill_flops_per_second = prefill_flops_per_second;
            o.measure_bandwidth = measure_bandwidth;
            o.event_buffer = event_buffer;
            o.room_wait = SecondsToDuration(room_wait_s);
            o.bounce_buffers = bounce_buffers;
            o.remote_probe_window_blocks = remote_probe_window_blocks;
            o.remote_probe_timeout = SecondsToDuration(remote_probe_timeout_s);
            o.worker_id = std::move(worker_id);
            // The pool's address and shape, read before the cache takes the tier; the memory
            // lives as long as the cache does.
            std::optional<DevicePoolView> view;
            int64_t hbm_blocks = 0;
            if (const auto& hbm = stack.tiers[0]; hbm != nullptr) {
              view = hbm->device_pool();
              hbm_blocks = hbm->info().capacity_blocks;
            }
            // Create takes the backends even when it fails: the stack is spent either way.
            o.tiers = std::move(stack.tiers);
            stack.consumed = true;
            absl::StatusOr<std::unique_ptr<KvCache>> made =
                Unlocked([&] { return KvCache::Create(ns, std::move(o)); });
            if (!made.ok()) throw StatusError(made.status());
            PyKvCache out;
            // Registered tensors (TierStack hbm_tensors) live as long as the cache: dropped, with
            // the GIL, right after it.
            auto* keep = new std::vector<py::object>(std::move(stack.keep_alive));
            out.cache = std::shared_ptr<KvCache>((*made).release(), [keep](KvCache* k) {
              delete k;
              py::gil_scoped_acquire gil;
              delete keep;
            });
            if (view.has_value() && !view->k_base.empty()) {
              out.pool = PyHbmPool{out.cache, ns.geometry(), stack.hbm_layout, hbm_blocks, *view};
            }
            return out;
          },
          py::arg("namespace"), py::arg("tiers"), py::kw_only(), py::arg("eviction_policy") = "lru",
          py::arg("hash") = HashAlgorithm::kXxh3_128,
          py::arg("write_policy") = WritePolicy::kWriteBack,
          py::arg("inclusion") = TierInclusion::kInclusive,
          py::arg("admit_after_uses") = std::array<int, kNumTiers>{1, 1, 1, 1},
          py::arg("demote_on_evict") = true, py::arg("prefill_flops_per_second") = 4e14,
          py::arg("measure_bandwidth") = true, py::arg("event_buffer") = 65536,
          py::arg("room_wait_s") = 10.0, py::arg("bounce_buffers") = 4,
          py::arg("remote_probe_window_blocks") = 32, py::arg("remote_probe_timeout_s") = 0.02,
          py::arg("worker_id") = "", py::arg("demote_by_value") = true,
          "KvCache::Create over a TierStack's backends (the stack is consumed).")
      .def_property_readonly("namespace",
                             [](const PyKvCache& c) { return Cache(c).cache_namespace(); })
      .def_property_readonly(
          "hbm_pool",
          [](const PyKvCache& c) {
            if (!c.pool.has_value()) {
              throw StatusError(absl::FailedPreconditionError(
                  "KvCache.hbm_pool: the HBM tier has no pool addresses (a metadata tier)"));
            }
            return *c.pool;
          },
          "The HBM pool as kvtier.HbmPool: the emulated HBM's host memory (writable, no copy), "
          "or CUDA memory (host_accessible False: cuda_array_interface() / tensor()).")
      // ---- Sequences
      .def(
          "create_sequence",
          [](const PyKvCache& c, uint64_t id, uint64_t session, OptAdapter adapter,
             OptSalt tenant_salt, Items multimodal, double retention_priority, double retention_s,
             bool enable_caching, bool readmission) {
            SequenceOptions o =
                Identity(std::move(adapter), std::move(tenant_salt), std::move(multimodal));
            o.session = session;
            o.retention_priority = retention_priority;
            o.retention = SecondsToDuration(retention_s);
            o.enable_caching = enable_caching;
            o.readmission = readmission;
            ThrowIfError(Unlocked([&] { return Cache(c).CreateSequence(SequenceId(id), o); }));
          },
          py::arg("id"), py::kw_only(), py::arg("session") = 0, py::arg("adapter") = py::none(),
          py::arg("tenant_salt") = py::none(), py::arg("multimodal") = Items{},
          py::arg("retention_priority") = 0.0, py::arg("retention_s") = 0.0,
          py::arg("enable_caching") = true, py::arg("readmission") = false,
          "enable_caching=False: the sequence's blocks are private (never indexed, never "
          "attached); readmission=True: it re-admits a preempted request, so what it attaches "
          "counts as readmitted_blocks, not hits.")
      .def(
          "attach_prefix",
          [](const PyKvCache& c, uint64_t id, const py::object& prompt) {
            Tokens ids;
            const auto span = TokenSpan(prompt, ids);
            return Unwrap(Unlocked([&] { return Cache(c).AttachPrefix(SequenceId(id), span); }));
          },
          py::arg("id"), py::arg("prompt"))
      .def(
          "append",
          [](const PyKvCache& c, uint64_t id, const py::object& tokens, RoomWait wait) {
            Tokens ids;
            const auto span = TokenSpan(tokens, ids);
            return Unwrap(Unlocked([&] { return Cache(c).Append(SequenceId(id), span, wait); }));
          },
          py::arg("id"), py::arg("tokens"), py::kw_only(), py::arg("wait") = RoomWait::kWait,
          "Slots for more tokens. wait=RoomWait.NEVER never blocks: ResourceExhaustedError "
          "(nothing changed) while HBM is short.")
      .def(
          "report_written",
          [](const PyKvCache& c, uint64_t id, int64_t num_tokens, std::optional<Completion> ready) {
            const Completion done = ready.value_or(Completion::Done(absl::OkStatus()));
            ThrowIfError(
                Unlocked([&] { return Cache(c).ReportWritten(SequenceId(id), num_tokens, done); }));
          },
          py::arg("id"), py::arg("num_tokens"), py::arg("ready") = py::none(),
          "The KV of tokens [0, num_tokens) is in HBM once `ready` fires (default: now).")
      .def(
          "completion_of_cuda_event",
          [](const PyKvCache& c, uintptr_t cuda_event) {
            return Unwrap(Unlocked(
                [&] { return Cache(c).CompletionOfCudaEvent(reinterpret_cast<void*>(cuda_event)); }));
          },
          py::arg("cuda_event"),
          "A kvtier.Completion that fires when the GPU reaches the CUDA event (an address, e.g. "
          "torch.cuda.Event().cuda_event after record()), as recorded now: report_written's "
          "`ready` without a host wait. UnimplementedError when the HBM tier is not CUDA memory.")
      .def(
          "fork",
          [](const PyKvCache& c, uint64_t parent, uint64_t child, int64_t num_tokens,
             RoomWait wait) {
            return Unwrap(Unlocked([&] {
              return Cache(c).Fork(SequenceId(parent), SequenceId(child), num_tokens, wait);
            }));
          },
          py::arg("parent"), py::arg("child"), py::arg("num_tokens"), py::kw_only(),
          py::arg("wait") = RoomWait::kWait,
          "A child with the parent's first num_tokens tokens; a BlockCopy to perform when the "
          "fork point is inside a block, else None.")
      .def(
          "truncate",
          [](const PyKvCache& c, uint64_t id, int64_t num_tokens, RoomWait wait) {
            return Unwrap(
                Unlocked([&] { return Cache(c).Truncate(SequenceId(id), num_tokens, wait); }));
          },
          py::arg("id"), py::arg("num_tokens"), py::kw_only(), py::arg("wait") = RoomWait::kWait,
          "Cuts the sequence back to its first num_tokens tokens; a BlockCopy (the cut block's "
          "first num_tokens % B positions into a fresh slot) to perform when the cut is inside a "
          "full block, else None.")
      .def(
          "check_room",
          [](const PyKvCache& c, std::optional<uint64_t> seq, std::optional<int64_t> num_new_tokens,
             std::optional<int64_t> num_slots) {
            if (num_slots.has_value()) {
              if (seq.has_value() || num_new_tokens.has_value()) {
                throw StatusError(absl::InvalidArgumentError(
                    "check_room: give num_slots alone, or seq and num_new_tokens"));
              }
              return Unwrap(Unlocked([&] { return Cache(c).CheckRoom(*num_slots); }));
            }
            if (!seq.has_value() || !num_new_tokens.has_value()) {
              throw StatusError(absl::InvalidArgumentError(
                  "check_room: give seq and num_new_tokens, or num_slots alone"));
            }
            return Unwrap(
                Unlocked([&] { return Cache(c).CheckRoom(SequenceId(*seq), *num_new_tokens); }));
          },
          py::kw_only(), py::arg("seq") = py::none(), py::arg("num_new_tokens") = py::none(),
          py::arg("num_slots") = py::none(),
          "Whether num_new_tokens more tokens of sequence seq (or num_slots new blocks, for a "
          "request not yet created) fit in HBM now: a RoomCheck. Never blocks on transfers.")
      .def(
          "release",
          [](const PyKvCache& c, uint64_t id, std::optional<StopReason> stop_reason,
             std::optional<double> expected_idle_s, bool preempted, bool last_turn) -> py::object {
            if (!stop_reason.has_value() && !expected_idle_s.has_value() && !preempted &&
                !last_turn) {
              ThrowIfError(Unlocked([&] { return Cache(c).Release(SequenceId(id)); }));
              return py::none();
            }
            ReleaseHints hints;
            hints.stop_reason = stop_reason.value_or(StopReason::kUnknown);
            hints.expected_idle = OptionalSeconds(expected_idle_s);
            hints.preempted = preempted;
            hints.last_turn = last_turn;
            return py::cast(
                Unwrap(Unlocked([&] { return Cache(c).Release(SequenceId(id), hints); })));
          },
          py::arg("id"), py::kw_only(), py::arg("stop_reason") = py::none(),
          py::arg("expected_idle_s") = py::none(), py::arg("preempted") = false,
          py::arg("last_turn") = false,
          "Drops the sequence (its written full blocks stay cached). With hints (stop_reason, "
          "expected_idle_s, preempted=True: the scheduler preempted the request, counted in "
          "stats().preemptions, or last_turn=True: the session sends no further request, its "
          "blocks go first), returns the HintOutcome; without, None.")
      .def(
          "get_sequence",
          [](const PyKvCache& c, uint64_t id) {
            return Unwrap(Unlocked([&] { return Cache(c).GetSequence(SequenceId(id)); }));
          },
          py::arg("id"))
      // ---- Hints
      .def(
          "pause",
          [](const PyKvCache& c, uint64_t id, std::optional<double> expected_idle_s,
             bool preempted) -> py::object {
            if (expected_idle_s.has_value() && !preempted) {
              const absl::Duration idle = SecondsToDuration(*expected_idle_s);
              ThrowIfError(Unlocked([&] { return Cache(c).Pause(SequenceId(id), idle); }));
              return py::none();
            }
            PauseHints hints;
            hints.expected_idle = OptionalSeconds(expected_idle_s);
            hints.preempted = preempted;
            return py::cast(
                Unwrap(Unlocked([&] { return Cache(c).Pause(SequenceId(id), hints); })));
          },
          py::arg("id"), py::arg("expected_idle_s") = py::none(), py::kw_only(),
          py::arg("preempted") = false,
          "Pauses the sequence (its written full blocks get a copy one tier down; its HBM copies "
          "become droppable). An agent's tool wait of about expected_idle_s: returns None "
          "(kvtier.InvalidArgumentError for a negative estimate). preempted=True (the scheduler "
          "swaps the request "
          "out; counted in stats().preemptions, its resume is a readmission) or no estimate: "
          "returns the HintOutcome (a negative estimate is rejected there, the pause happens).")
      .def(
          "resume",
          [](const PyKvCache& c, uint64_t id) {
            return Unwrap(Unlocked([&] { return Cache(c).Resume(SequenceId(id)); }));
          },
          py::arg("id"), "Ends a pause; the Completion fires once the blocks are back in HBM.")
      .def(
          "prefetch",
          [](const PyKvCache& c, const py::object& tokens, OptAdapter a, OptSalt s, Items mm) {
            Tokens ids;
            const auto span = TokenSpan(tokens, ids);
            const SequenceOptions o = Identity(std::move(a), std::move(s), std::move(mm));
            return Unwrap(Unlocked([&] { return Cache(c).Prefetch(span, o); }));
          },
          py::arg("tokens"), KVTIER_PY_IDENTITY_ARGS)
      .def(
          "retain_prefix",
          [](const PyKvCache& c, const py::object& tokens, double priority, double ttl_s,
             OptAdapter a, OptSalt s, Items mm) {
            Tokens ids;
            const auto span = TokenSpan(tokens, ids);
            const SequenceOptions o = Identity(std::move(a), std::move(s), std::move(mm));
            const absl::Duration ttl = SecondsToDuration(ttl_s);
            return Unwrap(Unlocked([&] { return Cache(c).RetainPrefix(span, priority, ttl, o); }));
          },
          py::arg("tokens"), py::arg("priority"), py::arg("ttl_s"), KVTIER_PY_IDENTITY_ARGS)
      .def(
          "invalidate_prefix",
          [](const PyKvCache& c, const py::object& tokens, int64_t from_token, OptAdapter a,
             OptSalt s, Items mm) {
            Tokens ids;
            const auto span = TokenSpan(tokens, ids);
            const SequenceOptions o = Identity(std::move(a), std::move(s), std::move(mm));
            return Unwrap(Unlocked([&] { return Cache(c).InvalidatePrefix(span, from_token, o); }));
          },
          py::arg("tokens"), py::arg("from_token") = 0, KVTIER_PY_IDENTITY_ARGS)
      .def(
          "retain_session",
          [](const PyKvCache& c, uint64_t session, double priority, double ttl_s) {
            const absl::Duration ttl = SecondsToDuration(ttl_s);
            return Unwrap(Unlocked([&] { return Cache(c).RetainSession(session, priority, ttl); }));
          },
          py::arg("session"), py::arg("priority"), py::arg("ttl_s"))
      .def(
          "invalidate_session",
          [](const PyKvCache& c, uint64_t session) {
            return Unwrap(Unlocked([&] { return Cache(c).InvalidateSession(session); }));
          },
          py::arg("session"))
      // ---- Residency
      .def(
          "ensure_resident",
          [](const PyKvCache& c, uint64_t id, int64_t begin_token, int64_t end_token,
             std::optional<double> timeout_s, ResidencyMode mode) {
            EnsureResidentOptions o;
            o.deadline = DeadlineAfter(timeout_s);
            o.mode = mode;
            ResidencyTicket ticket = Unwrap(Unlocked([&] {
              return Cache(c).EnsureResident(SequenceId(id), begin_token, end_token, o);
            }));
            return PyTicket{std::move(ticket), c.cache, false};
          },
          py::arg("id"), py::arg("begin_token"), py::arg("end_token"), py::kw_only(),
          py::arg("timeout_s") = py::none(), py::arg("mode") = ResidencyMode::kWait,
          "Pins blocks [begin / B, ceil(end / B)) in HBM, onboarding those below; a "
          "ResidencyTicket, usable as a context manager (released on exit).")
      .def(
          "release_ticket",
          [](const PyKvCache& c, PyTicket& t) {
            // As KvCache::ReleaseTicket: a ticket of another cache is unknown to this one.
            if (t.cache != c.cache) {
              throw StatusError(absl::NotFoundError("ReleaseTicket: ticket " +
                                                    std::to_string(t.ticket.id()) +
                                                    " was issued by another cache"));
            }
            ReleaseTicket(t);
          },
          py::arg("ticket"))
      // ---- Lookups, stats, events
      .def(
          "lookup",
          [](const PyKvCache& c, const py::object& tokens, OptAdapter a, OptSalt s, Items mm) {
            Tokens ids;
            const auto span = TokenSpan(tokens, ids);
            const SequenceOptions o = Identity(std::move(a), std::move(s), std::move(mm));
            return Unwrap(Unlocked([&] { return Cache(c).Lookup(span, o); }));
          },
          py::arg("tokens"), KVTIER_PY_IDENTITY_ARGS)
      .def(
          "hash_prompt",
          [](const PyKvCache& c, const py::object& tokens, OptAdapter a, OptSalt s, Items mm) {
            Tokens ids;
            const auto span = TokenSpan(tokens, ids);
            const SequenceOptions o = Identity(std::move(a), std::move(s), std::move(mm));
            return Unwrap(Unlocked([&] { return Cache(c).HashPrompt(span, o); }));
          },
          py::arg("tokens"), KVTIER_PY_IDENTITY_ARGS,
          "The prompt's block keys, hashed once for lookup_hashed and attach_hashed_prefix.")
      .def(
          "lookup_hashed",
          [](const PyKvCache& c, const HashedPrompt& prompt) {
            return Unwrap(Unlocked([&] { return Cache(c).LookupHashed(prompt); }));
          },
          py::arg("prompt"))
      .def(
          "attach_hashed_prefix",
          [](const PyKvCache& c, uint64_t id, const HashedPrompt& prompt) {
            return Unwrap(
                Unlocked([&] { return Cache(c).AttachHashedPrefix(SequenceId(id), prompt); }));
          },
          py::arg("id"), py::arg("prompt"))
      .def("stats", [](const PyKvCache& c) { return Unlocked([&] { return Cache(c).stats(); }); })
      .def(
          "reset_prefix_cache",
          [](const PyKvCache& c, std::optional<Tier> tier) {
            return Unwrap(Unlocked([&] { return Cache(c).ResetPrefixCache(tier); }));
          },
          py::arg("tier") = py::none(),
          "Drops every droppable cached copy of `tier` (None: every tier); held and busy copies "
          "stay. Emits REMOVED per copy, then ALL_CLEARED per tier cleared. Returns how many "
          "copies were dropped.")
      .def(
          "poll_events",
          [](const PyKvCache& c, uint64_t after_sequence, size_t max_events) {
            const std::vector<CacheEvent> events =
                Unlocked([&] { return Cache(c).PollEvents(after_sequence, max_events); });
            std::vector<PyCacheEvent> out;
            out.reserve(events.size());
            for (const CacheEvent& e : events) {
              out.push_back({e, std::string(e.adapter_id), std::string(e.worker_id)});
            }
            return out;
          },
          py::arg("after_sequence") = 0, py::arg("max_events") = 4096,
          "Events numbered above after_sequence, oldest first.")
      .def(
          "wait_idle",
          [](const PyKvCache& c, std::optional<double> timeout_s) {
            const absl::Time deadline = DeadlineAfter(timeout_s);
            ThrowIfError(Unlocked([&] { return Cache(c).WaitIdle(deadline); }));
          },
          py::arg("timeout_s") = py::none(), "Blocks until no transfer is in flight.")
      .def("check_invariants", [](const PyKvCache& c) {
        ThrowIfError(Unlocked([&] { return Cache(c).CheckInvariants(); }));
      });
}

#undef KVTIER_PY_IDENTITY_ARGS

}  // namespace kvtier::python
