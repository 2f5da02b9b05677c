#include "remote/redis/redis_connection.h"

#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvtier::internal {
namespace {

timeval SocketTimeout(absl::Duration d) {
  // At least 1 ms: a zero timeval means "no timeout" to the socket layer.
  d = std::max(d, absl::Milliseconds(1));
  return absl::ToTimeval(d);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisConnection>> RedisConnection::Connect(
    const RedisConnectOptions& options, absl::Duration timeout) {
  const std::string address = absl::StrCat(options.host, ":", options.port);
  redisContext* ctx =
      redisConnectWithTimeout(options.host.c_str(), options.port, SocketTimeout(timeout));
  if (ctx == nullptr) {
    return absl::UnavailableError(absl::StrCat("redis ", address, ": out of memory connecting"));
  }
  if (ctx->err != 0) {
    absl::Status s =
        absl::UnavailableError(absl::StrCat("redis ", address, ": connect failed: ", ctx->errstr));
    redisFree(ctx);
    return s;
  }
  std::unique_ptr<RedisConnection> conn(new RedisConnection(ctx, address));
  std::vector<std::string_view> auth;
  if (!options.password.empty()) {
    auth = {"AUTH"};
    if (!options.username.empty()) auth.push_back(options.username);
    auth.push_back(options.password);
    conn->Append(auth);
  }
  const std::string db = std::to_string(options.database);
  if (options.database != 0) conn->Append({"SELECT", db});
  if (conn->appended() > 0) {
    std::vector<RedisReplyPtr> replies;
    if (absl::Status s = conn->RoundTrip(timeout, &replies); !s.ok()) {
      return absl::UnavailableError(s.message());
    }
    for (const RedisReplyPtr& r : replies) {
      if (r->type == REDIS_REPLY_ERROR) {
        return absl::UnavailableError(absl::StrCat("redis ", address, ": ",
                                                   auth.empty() ? "SELECT" : "AUTH/SELECT",
                                                   " refused: ", DescribeReply(r.get())));
      }
    }
  }
  return conn;
}

RedisConnection::~RedisConnection() { redisFree(ctx_); }

void RedisConnection::Append(absl::Span<const std::string_view> argv) {
  constexpr int kInline = 8;
  const char* ptrs[kInline];
  size_t lens[kInline];
  std::vector<const char*> ptr_vec;
  std::vector<size_t> len_vec;
  const char** p = ptrs;
  size_t* l = lens;
  if (argv.size() > kInline) {
    ptr_vec.resize(argv.size());
    len_vec.resize(argv.size());
    p = ptr_vec.data();
    l = len_vec.data();
  }
  for (size_t i = 0; i < argv.size(); ++i) {
    p[i] = argv[i].data();
    l[i] = argv[i].size();
  }
  if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), p, l) != REDIS_OK) {
    broken_ = true;  // out of memory: the round trip reports it
  }
  ++appended_;
}

absl::Status RedisConnection::SetTimeout(absl::Duration timeout) {
  if (redisSetTimeout(ctx_, SocketTimeout(timeout)) != REDIS_OK)
    return ErrorStatus("setting a timeout");
  return absl::OkStatus();
}

absl::Status RedisConnection::ErrorStatus(std::string_view what) const {
  const std::string message =
      absl::StrCat("redis ", address_, ": ", absl::string_view(what.data(), what.size()), ": ",
                   ctx_->err != 0 ? ctx_->errstr : "failed");
  // hiredis 0.14 reports a socket timeout as an I/O error with errno EAGAIN.
  if (ctx_->err == REDIS_ERR_IO &&
      (errno == EAGAIN || errno == EWOULDBLOCK ||
       std::string_view(ctx_->errstr) == "Resource temporarily unavailable")) {
    return absl::DeadlineExceededError(message);
  }
  return absl::UnavailableError(message);
}

absl::Status RedisConnection::RoundTrip(absl::Duration timeout,
                                        absl::FunctionRef<void(RedisReplyPtr reply)> on_reply) {
  const int expected = appended_;
  appended_ = 0;
  if (broken_)
    return absl::UnavailableError(absl::StrCat("redis ", address_, ": connection broken"));
  if (absl::Status s = SetTimeout(timeout); !s.ok()) {
    broken_ = true;
    return s;
  }
  for (int i = 0; i < expected; ++i) {
    void* reply = nullptr;
    if (redisGetReply(ctx_, &reply) != REDIS_OK || reply == nullptr) {
      broken_ = true;
      return ErrorStatus(i == 0 ? "sending a pipeline" : "reading replies");
    }
    on_reply(RedisReplyPtr(static_cast<redisReply*>(reply)));
  }
  return absl::OkStatus();
}

std::string DescribeReply(const redisReply* r) {
  switch (r->type) {
    case REDIS_REPLY_ERROR:
      return absl::StrCat("error: ", absl::string_view(r->str, r->len));
    case REDIS_REPLY_STATUS:
      return absl::StrCat("status: ", absl::string_view(r->str, r->len));
    case REDIS_REPLY_STRING:
      return absl::StrCat("string of ", r->len, " bytes");
    case REDIS_REPLY_INTEGER:
      return absl::StrCat("integer ", r->integer);
    case REDIS_REPLY_NIL:
      return "nil";
    case REDIS_REPLY_ARRAY:
      return absl::StrCat("array of ", r->elements);
    default:
      return absl::StrCat("reply type ", r->type);
  }
}

}  // namespace kvtier::internal
