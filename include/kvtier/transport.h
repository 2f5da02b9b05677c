// Transport: the narrow interface to a remote or shared key-value store behind the remote tier
// (Redis, Redis Cluster, a shared directory, an in-process map). Batched and asynchronous: every
// call returns one Completion per item, in order, and every item completes by the call's
// deadline (kDeadlineExceeded otherwise), so a dead or slow store is never waited on without
// bound. Values are opaque bytes; framing, checksums and compression are the remote tier's.
//
// Thread-safety: implementations are thread-safe. A transport may not be destroyed from inside a
// completion callback it fired (its destructor may join the thread running it). Ownership: value
// buffers passed to Put and the output vectors passed to Get must stay valid until their Completion
// fires; keys and the item arrays themselves are copied before a call returns. A call must not
// wait for the store (the remote tier calls Delete under the cache's lock): its I/O runs on the
// transport's own threads. A transport's deadline is a bound on waiting for the store, not on
// the store's work: a write or delete the deadline answered may still land later.
#ifndef KVTIER_TRANSPORT_H_
#define KVTIER_TRANSPORT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtier/block_key.h"
#include "kvtier/completion.h"

namespace kvtier {

struct TransportPut {
  std::string key;
  absl::Span<const std::byte> value;
  // Stored in front of `value`: the value is value_prefix then value. Lets a caller send a frame
  // header and an untouched block without first joining them into one buffer.
  absl::Span<const std::byte> value_prefix;
  // Store only if the key holds no value (Redis `SET ... NX`; the directory transport skips the
  // write when the file exists and links the new file into place only if none appeared
  // meanwhile): two writers of one content-addressed block store it once. An item skipped
  // because the key exists completes with kAlreadyExists (the stored value is left as it is).
  bool if_absent = false;
};

// Receives a stored value in place, so a transport that can (Redis) moves it straight from the
// network into the buffers where it belongs. Begin gets the value's length in bytes and returns
// the buffers to fill, in order, whose sizes sum to that length, or an error (the value is then
// dropped and the item fails with it). Received is called with each piece as it lands, in order,
// the pieces covering the value exactly (so a receiver can checksum bytes while they are still
// in cache). Finish runs once all have landed; its status is the item's. All run on one
// transport thread, only while the item has not completed (so never after its deadline fired),
// and must not block. When a value cannot be received whole (connection lost), the item fails
// and Finish is not called: the buffers may then hold part of the value and must be ignored.
class TransportReceiver {
 public:
  virtual ~TransportReceiver() = default;
  virtual absl::StatusOr<std::vector<absl::Span<std::byte>>> Begin(int64_t length) = 0;
  virtual void Received(absl::Span<const std::byte> piece) = 0;
  virtual absl::Status Finish() = 0;
};

struct TransportGet {
  std::string key;
  std::vector<std::byte>* value = nullptr;  // replaced with the stored bytes (unless `receiver`)
  int64_t max_bytes = 0;  // a larger stored value is kDataLoss, not read; 0: no limit
  // When set, the value goes to the receiver instead of `value` (which may then be null).
  std::shared_ptr<TransportReceiver> receiver;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // e.g. "in_process", "directory(/mnt/kv)", "redis(127.0.0.1:6379)".
  virtual std::string name() const = 0;

  // Stores each value under its key, replacing what was there (unless if_absent). Readers never
  // see a value half-written. Errors: kAlreadyExists for an if_absent item whose key exists;
  // kInvalidArgument for a key the store cannot hold; kUnavailable when the store does not answer;
  // kResourceExhausted when it is full; kDeadlineExceeded.
  virtual std::vector<Completion> Put(absl::Span<const TransportPut> items,
                                      absl::Time deadline) = 0;
  // Reads each key. Errors: kNotFound for a missing key; kInvalidArgument for neither output nor
  // receiver; the receiver's own errors;
  // kDataLoss for a value over max_bytes; kUnavailable, kDeadlineExceeded as for Put.
  virtual std::vector<Completion> Get(absl::Span<const TransportGet> items,
                                      absl::Time deadline) = 0;
  // OK if the key exists, kNotFound if not; other errors as for Put.
  virtual std::vector<Completion> Exists(absl::Span<const std::string> keys,
                                         absl::Time deadline) = 0;
  // Removes each key; kNotFound if it was not there; other errors as for Put.
  virtual std::vector<Completion> Delete(absl::Span<const std::string> keys,
                                         absl::Time deadline) = 0;
};

// The store key of a block: `prefix` + 32 hex digits of the namespace digest + ":" + 32 hex
// digits of the block key. Different models, dtypes, tenants (anything in the namespace) never
// share a key, and the prefix separates deployments sharing one store.
std::string RemoteBlockKey(std::string_view prefix, const std::array<uint8_t, 16>& ns_digest,
                           const BlockKey& key);

}  // namespace kvtier

#endif  // KVTIER_TRANSPORT_H_
