// One blocking hiredis connection to one Redis server, used by one thread at a time (the
// transport's worker that owns it). Commands are appended, then sent and answered in one round
// trip (pipelining).
#ifndef KVTIER_REMOTE_REDIS_REDIS_CONNECTION_H_
#define KVTIER_REMOTE_REDIS_REDIS_CONNECTION_H_

#include <hiredis/hiredis.h>

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

  // Queues one command (argv[0] is the command name; arguments are binary-safe). Nothing is sent
  // until RoundTrip.
  void Append(absl::Span<const std::string_view> argv);
  int appended() const { return appended_; }

  // Sends every queued command and reads one reply for each, in order, handing each to
  // `on_reply` as soon as it is parsed (so a caller can finish early items while later replies
  // are still arriving). Each socket wait is bounded by `timeout`. Errors: kDeadlineExceeded when
  // a wait timed out, kUnavailable for another socket error or a protocol error; the replies
  // before it were handed over, and the connection is broken (drop it).
  absl::Status RoundTrip(absl::Duration timeout,
                         absl::FunctionRef<void(RedisReplyPtr reply)> on_reply);
  // The same, collecting the replies.
  absl::Status RoundTrip(absl::Duration timeout, std::vector<RedisReplyPtr>* replies) {
    return RoundTrip(timeout, [replies](RedisReplyPtr r) { replies->push_back(std::move(r)); });
  }

  bool broken() const { return broken_; }
  const std::string& address() const { return address_; }

 private:
  RedisConnection(redisContext* ctx, std::string address)
      : ctx_(ctx), address_(std::move(address)) {}
  absl::Status SetTimeout(absl::Duration timeout);
  absl::Status ErrorStatus(std::string_view what) const;

  redisContext* ctx_;
  std::string address_;
  int appended_ = 0;
  bool broken_ = false;
};

// A one-line description of a reply for error messages ("error: MOVED 3999 ...").
std::string DescribeReply(const redisReply* reply);

}  // namespace kvtier::internal

#endif  // KVTIER_REMOTE_REDIS_REDIS_CONNECTION_H_
