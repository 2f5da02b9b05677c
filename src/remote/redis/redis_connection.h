// One blocking hiredis connection to one Redis server, used by one thread at a time (the
// transport's worker that owns it). Commands are appended, then sent and answered in one round
// trip (pipelining).
#ifndef KVTIER_REMOTE_REDIS_REDIS_CONNECTION_H_
#define KVTIER_REMOTE_REDIS_REDIS_CONNECTION_H_

#include <hiredis/hiredis.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace kvtier::internal {

struct RedisReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using RedisReplyPtr = std::unique_ptr<redisReply, RedisReplyDeleter>;

struct RedisConnectOptions {
  std::string host;
  int port = 0;
  std::string username;
  std::string password;
  int database = 0;
};

class RedisConnection {
 public:
  // Connects within `timeout`, then sends AUTH and SELECT as the options ask. Errors:
  // kUnavailable (refused, unreachable, timed out, AUTH or SELECT refused) naming the address.
  static absl::StatusOr<std::unique_ptr<RedisConnection>> Connect(
      const RedisConnectOptions& options, absl::Duration timeout);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Queues one command (argv[0] is the command name; arguments are binary-safe) in hiredis's
  // output buffer, which copies it. For control commands (AUTH, SELECT, CLUSTER SLOTS). Nothing
  // is sent until RoundTrip.
  void Append(absl::Span<const std::string_view> argv);
  int appended() const { return appended_; }

  // One argument of a queued command: `head` then `tail` (e.g. a frame header, then the block).
  struct Arg {
    std::string_view head;
    std::string_view tail = {};
  };
  // Queues one command written straight to the socket (sendmsg with an iovec per large piece):
  // arguments of 4 KiB or more are sent from the caller's memory, not copied, so they must stay
  // valid and unchanged until RoundTrip returns. Not to be mixed with Append in one round trip.
  void Queue(std::initializer_list<Arg> argv);
  int queued() const { return queued_; }

  // Consumes a top-level bulk-string reply in place, while the reply is parsed: gets the index
  // of the reply in this round trip and its bytes (valid only during the call); returns true if
  // it took them, and the reply then reaches on_reply as a STRING with str == nullptr (see
  // IsConsumed). Must not block.
  using StringSink = std::function<bool(size_t index, absl::Span<const std::byte> bytes)>;

  // Sends every queued command and reads one reply for each, in order, handing each to
  // `on_reply` as soon as it is parsed (so a caller can finish early items while later replies
  // are still arriving). Each socket wait is bounded by `timeout`. Errors: kDeadlineExceeded when
  // a wait timed out, kUnavailable for another socket error or a protocol error; the replies
  // before it were handed over, and the connection is broken (drop it).
  absl::Status RoundTrip(absl::Duration timeout,
                         absl::FunctionRef<void(RedisReplyPtr reply)> on_reply,
                         const StringSink* sink = nullptr);
  // The same, collecting the replies.
  absl::Status RoundTrip(absl::Duration timeout, std::vector<RedisReplyPtr>* replies) {
    return RoundTrip(timeout, [replies](RedisReplyPtr r) { replies->push_back(std::move(r)); });
  }

  bool broken() const { return broken_; }
  const std::string& address() const { return address_; }

 private:
  RedisConnection(redisContext* ctx, std::string address);
  absl::Status SetTimeout(absl::Duration timeout);
  absl::Status ErrorStatus(std::string_view what) const;
  absl::Status SendQueued();
  void AddPiece(std::string_view bytes);

  // hiredis reply-object functions: hiredis's own, plus the string sink.
  static void* CreateString(const redisReadTask* task, char* str, size_t len);
  static void* CreateArray(const redisReadTask* task, int elements);
  static void* CreateInteger(const redisReadTask* task, long long value);
  static void* CreateNil(const redisReadTask* task);
  static redisReply* NewReply(const redisReadTask* task, int type);
  static redisReplyObjectFunctions reply_functions_;

  redisContext* ctx_;
  std::string address_;
  int appended_ = 0;
  bool broken_ = false;
  // Queued commands: small pieces packed in `small_`, large ones by address; `pieces_` lists
  // them in order ({nullptr, offset, n} for a piece of small_).
  struct Piece {
    const char* data;
    size_t offset;
    size_t size;
  };
  std::string small_;
  std::vector<Piece> pieces_;
  int queued_ = 0;
  // During a RoundTrip: the sink and how many top-level replies have begun.
  const StringSink* sink_ = nullptr;
  size_t replies_begun_ = 0;
};

// True for a reply whose bytes a StringSink took.
inline bool IsConsumed(const redisReply* r) {
  return r->type == REDIS_REPLY_STRING && r->str == nullptr && r->integer == 1;
}

// A one-line description of a reply for error messages ("error: MOVED 3999 ...").
std::string DescribeReply(const redisReply* reply);

}  // namespace kvtier::internal

#endif  // KVTIER_REMOTE_REDIS_REDIS_CONNECTION_H_
