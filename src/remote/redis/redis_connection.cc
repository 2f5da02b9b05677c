#include "remote/redis/redis_connection.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"

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

redisReplyObjectFunctions RedisConnection::reply_functions_ = {
    &RedisConnection::CreateString, &RedisConnection::CreateArray, &RedisConnection::CreateInteger,
    &RedisConnection::CreateNil, &freeReplyObject};

RedisConnection::RedisConnection(redisContext* ctx, std::string address)
    : ctx_(ctx), address_(std::move(address)) {
  // Our reply objects are hiredis's redisReply, allocated as hiredis does (calloc/malloc, freed
  // by freeReplyObject), plus the string sink; privdata reaches every read task.
  ctx_->reader->fn = &reply_functions_;
  ctx_->reader->privdata = this;
  // Keep the receive buffer between replies: hiredis otherwise frees it once idle above 16 KiB
  // and regrows it by doubling for the next 2 MiB value (about one extra copy of every value).
  // It stays about one value plus 16 KiB per connection.
  ctx_->reader->maxbuf = 0;
}

RedisConnection::~RedisConnection() { redisFree(ctx_); }

redisReply* RedisConnection::NewReply(const redisReadTask* task, int type) {
  auto* r = static_cast<redisReply*>(calloc(1, sizeof(redisReply)));
  if (r == nullptr) return nullptr;
  r->type = type;
  if (task->parent != nullptr) {
    auto* parent = static_cast<redisReply*>(task->parent->obj);
    parent->element[task->idx] = r;
  } else {
    static_cast<RedisConnection*>(task->privdata)->replies_begun_++;
  }
  return r;
}

void* RedisConnection::CreateString(const redisReadTask* task, char* str, size_t len) {
  auto* self = static_cast<RedisConnection*>(task->privdata);
  const size_t index = self->replies_begun_;  // this reply's, if it is top-level
  redisReply* r = NewReply(task, task->type);
  if (r == nullptr) return nullptr;
  r->len = len;
  if (task->parent == nullptr && task->type == REDIS_REPLY_STRING && self->sink_ != nullptr &&
      (*self->sink_)(index, {reinterpret_cast<const std::byte*>(str), len})) {
    r->integer = 1;  // consumed: no copy of the bytes
    return r;
  }
  r->str = static_cast<char*>(malloc(len + 1));
  if (r->str == nullptr) {
    // hiredis frees a partially built reply through its parent; a top-level one is ours.
    if (task->parent == nullptr) free(r);
    return nullptr;
  }
  std::memcpy(r->str, str, len);
  r->str[len] = '\0';
  return r;
}

void* RedisConnection::CreateArray(const redisReadTask* task, int elements) {
  redisReply* r = NewReply(task, REDIS_REPLY_ARRAY);
  if (r == nullptr) return nullptr;
  if (elements > 0) {
    r->element =
        static_cast<redisReply**>(calloc(static_cast<size_t>(elements), sizeof(redisReply*)));
    if (r->element == nullptr) {
      if (task->parent == nullptr) free(r);
      return nullptr;
    }
  }
  r->elements = static_cast<size_t>(elements);
  return r;
}

void* RedisConnection::CreateInteger(const redisReadTask* task, long long value) {
  redisReply* r = NewReply(task, REDIS_REPLY_INTEGER);
  if (r != nullptr) r->integer = value;
  return r;
}

void* RedisConnection::CreateNil(const redisReadTask* task) {
  return NewReply(task, REDIS_REPLY_NIL);
}

void RedisConnection::AddPiece(std::string_view bytes) {
  if (bytes.empty()) return;
  if (bytes.size() >= 4096) {
    pieces_.push_back({bytes.data(), 0, bytes.size()});
    return;
  }
  if (!pieces_.empty() && pieces_.back().data == nullptr &&
      pieces_.back().offset + pieces_.back().size == small_.size()) {
    pieces_.back().size += bytes.size();  // extends the last small piece
  } else {
    pieces_.push_back({nullptr, small_.size(), bytes.size()});
  }
  small_.append(bytes);
}

void RedisConnection::Queue(std::initializer_list<Arg> argv) {
  // RESP: *<argc>\r\n, then $<len>\r\n<bytes>\r\n per argument.
  char line[32];
  AddPiece({line, static_cast<size_t>(std::snprintf(line, sizeof(line), "*%zu\r\n", argv.size()))});
  for (const Arg& a : argv) {
    AddPiece({line, static_cast<size_t>(std::snprintf(line, sizeof(line), "$%zu\r\n",
                                                      a.head.size() + a.tail.size()))});
    AddPiece(a.head);
    AddPiece(a.tail);
    AddPiece("\r\n");
  }
  ++queued_;
}

absl::Status RedisConnection::SendQueued() {
  // iovecs over the pieces, sent with sendmsg: partial sends resume where they stopped, and
  // MSG_NOSIGNAL keeps a dead peer from raising SIGPIPE.
  std::vector<iovec> iov(pieces_.size());
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& p = pieces_[i];
    iov[i].iov_base = const_cast<char*>(p.data != nullptr ? p.data : small_.data() + p.offset);
    iov[i].iov_len = p.size;
  }
  size_t first = 0;
  while (first < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    const ssize_t sent = sendmsg(ctx_->fd, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      broken_ = true;
      const std::string message =
          absl::StrCat("redis ", address_, ": sending a pipeline: ", std::strerror(e));
      return e == EAGAIN || e == EWOULDBLOCK ? absl::DeadlineExceededError(message)
                                             : absl::UnavailableError(message);
    }
    size_t left = static_cast<size_t>(sent);
    while (first < iov.size() && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      ++first;
    }
    if (left > 0) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return absl::OkStatus();
}

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
                                        absl::FunctionRef<void(RedisReplyPtr reply)> on_reply,
                                        const StringSink* sink) {
  const int expected = appended_ + queued_;
  const bool direct = queued_ > 0;
  const bool mixed = appended_ > 0 && queued_ > 0;
  appended_ = 0;
  queued_ = 0;
  struct Reset {
    RedisConnection* self;
    ~Reset() {
      self->small_.clear();
      self->pieces_.clear();
      self->sink_ = nullptr;
    }
  } reset{this};
  if (broken_) {
    return absl::UnavailableError(absl::StrCat("redis ", address_, ": connection broken"));
  }
  if (mixed) {  // their relative order would be lost
    broken_ = true;
    return absl::InternalError(absl::StrCat("redis ", address_, ": Append and Queue mixed"));
  }
  if (absl::Status s = SetTimeout(timeout); !s.ok()) {
    broken_ = true;
    return s;
  }
  if (direct) KVTIER_RETURN_IF_ERROR(SendQueued());
  sink_ = sink;
  replies_begun_ = 0;
  for (int i = 0; i < expected; ++i) {
    void* reply = nullptr;
    if (redisGetReply(ctx_, &reply) != REDIS_OK || reply == nullptr) {
      broken_ = true;
      return ErrorStatus(i == 0 && !direct ? "sending a pipeline" : "reading replies");
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
