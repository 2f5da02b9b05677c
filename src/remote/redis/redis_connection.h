// One blocking connection to one Redis server, used by one thread at a time (the transport's
// worker that owns it). hiredis makes the connection and runs control commands (AUTH, SELECT,
// CLUSTER SLOTS: Append + RoundTrip). Data commands (Queue + RoundTripQueued) are written and
// read by this class itself: sendmsg with large arguments by reference, and a small RESP2 reader
// (https://redis.io/docs/reference/protocol-spec/) that receives a bulk string straight into the
// buffers its consumer names, so a 2 MiB value crosses memory once (kernel to destination)
// instead of three times through hiredis (stack buffer, reader buffer, reply object).
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
  // Connects and sends AUTH and SELECT as the options ask, all within `timeout`. Errors:
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

  // Sends every queued command and reads one reply for each, in order, handing each to
  // `on_reply` as soon as it is parsed (so a caller can finish early items while later replies
  // are still arriving). The whole round trip is bounded by `timeout` (a server trickling its
  // reply does not extend it). Errors: kDeadlineExceeded when it ran out, kUnavailable for
  // another socket error or a protocol error; the replies before it were handed over, and the
  // connection is broken (drop it).
  absl::Status RoundTrip(absl::Duration timeout,
                         absl::FunctionRef<void(RedisReplyPtr reply)> on_reply);
  // The same, collecting the replies.
  absl::Status RoundTrip(absl::Duration timeout, std::vector<RedisReplyPtr>* replies) {
    return RoundTrip(timeout, [replies](RedisReplyPtr r) { replies->push_back(std::move(r)); });
  }

  // A reply to a queued command. A bulk string goes to the buffers that BulkTarget named
  // (`delivered`), is skipped (`skipped`, when the target asked for that), or is kept in `text`.
  struct Reply {
    int type = REDIS_REPLY_NIL;  // REDIS_REPLY_STATUS, _ERROR, _INTEGER, _STRING or _NIL
    std::string text;            // status or error line, or a kept bulk string
    long long integer = 0;
    bool delivered = false;
    bool skipped = false;
  };
  // Where the bulk-string reply to queued command `index` goes: buffers whose sizes sum to
  // `length` (filled in order), `skip` set to drop the bytes unread by anyone, or neither to
  // keep them in Reply::text.
  struct BulkTarget {
    std::vector<absl::Span<std::byte>> buffers;
    bool skip = false;
    // Receiving into `buffers` must end by then (the owner of the buffers gives up then).
    absl::Time deadline = absl::InfiniteFuture();
    // Called with each piece of `buffers` as it lands, in order (optional).
    std::function<void(absl::Span<const std::byte>)> on_bytes;
    // Optional. When `deadline` passes mid-value (before the read's own deadline), called once
    // with kDeadlineExceeded as soon as nothing more is written into `buffers` (their owner may
    // take them back); the rest of the value is then read into a sink by the read's deadline,
    // so the replies after it on this connection still arrive, and the reply is `skipped`.
    // Without it, the connection breaks there, and so does every reply after it.
    std::function<void(const absl::Status&)> on_cut;
  };
  // Sends the queued commands (by `send_deadline`), calls `on_sent`, then reads one reply each,
  // in order, by `read_deadline`: `target` is asked where each bulk string goes before its bytes
  // are read, and `on_reply` gets every reply once it is whole. Waits use poll() against these
  // absolute times, so a server that trickles bytes cannot stretch them. Errors:
  // kDeadlineExceeded when a deadline passed, kUnavailable for a socket or protocol error or
  // buffers that do not match the bulk's length; the connection is then broken, and a bulk being
  // received may have partly filled its buffers.
  absl::Status RoundTripQueued(absl::Time send_deadline, absl::Time read_deadline,
                               absl::FunctionRef<BulkTarget(size_t index, int64_t length)> target,
                               absl::FunctionRef<void()> on_sent,
                               absl::FunctionRef<void(size_t index, const Reply& reply)> on_reply);
  // The largest bulk string the reader accepts: Redis's own default proto-max-bulk-len.
  static constexpr int64_t kMaxBulkBytes = int64_t{512} << 20;
  // The largest bulk string kept in Reply::text (one the target sends to no buffers and does not
  // skip); values go to buffers.
  static constexpr int64_t kMaxKeptBulkBytes = int64_t{64} << 10;

  bool broken() const { return broken_; }
  const std::string& address() const { return address_; }

 private:
  RedisConnection(redisContext* ctx, std::string address)
      : ctx_(ctx), address_(std::move(address)) {}
  absl::Status SetTimeout(absl::Duration timeout);
  absl::Status ErrorStatus(std::string_view what) const;
  absl::Status SocketError(std::string_view what, int err);
  absl::Status SendQueued(absl::Time deadline);
  void AddPiece(std::string_view bytes);
  // Waits until the socket is ready for `events` or `deadline` passes (kDeadlineExceeded).
  absl::Status Wait(short events, absl::Time deadline, std::string_view what);
  // The RESP reader over the socket: buffered lines, and bulk bytes straight into buffers.
  absl::Status ReadMore(absl::Time deadline);
  absl::Status ReadLine(std::string_view* line, absl::Time deadline);
  // `*read` (optional) gets the bytes placed in `out`, also on error.
  absl::Status ReadInto(absl::Span<std::byte> out, absl::Time deadline,
                        const std::function<void(absl::Span<const std::byte>)>* on_bytes = nullptr,
                        size_t* read = nullptr);
  // Reads `length` bytes into a sink by `deadline`.
  absl::Status Skip(int64_t length, absl::Time deadline);
  absl::Status ReadReply(size_t index,
                         absl::FunctionRef<BulkTarget(size_t index, int64_t length)> target,
                         absl::Time deadline, Reply* reply);

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
  // Receive buffer of the RESP reader: bytes [rpos_, rend_) are unread.
  std::vector<char> rbuf_ = std::vector<char>(64 * 1024);
  size_t rpos_ = 0;
  size_t rend_ = 0;
};

// A one-line description of a reply for error messages ("error: MOVED 3999 ...").
std::string DescribeReply(const redisReply* reply);
std::string DescribeReply(const RedisConnection::Reply& reply);

}  // namespace kvtier::internal

#endif  // KVTIER_REMOTE_REDIS_REDIS_CONNECTION_H_
