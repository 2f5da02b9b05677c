// RedisConnection (redis_connection.h): one socket; sendmsg out, RESP2 replies in.
#include "remote/redis/redis_connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

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
  const absl::Time deadline = absl::Now() + timeout;
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
    const absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(1));
    if (absl::Status s = conn->RoundTrip(left, &replies); !s.ok()) {
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

namespace {

// "<tag><n>\r\n" into `line` (a RESP array or bulk header); its length. to_chars, not snprintf:
// this runs twice per argument of every command (a 128-key probe: 384 times).
size_t RespHeader(char tag, size_t n, char (&line)[32]) {
  line[0] = tag;
  char* end = std::to_chars(line + 1, line + sizeof(line) - 2, n).ptr;
  *end++ = '\r';
  *end++ = '\n';
  return static_cast<size_t>(end - line);
}

}  // namespace

void RedisConnection::Queue(std::initializer_list<Arg> argv) {
  // RESP: *<argc>\r\n, then $<len>\r\n<bytes>\r\n per argument.
  char line[32];
  AddPiece({line, RespHeader('*', argv.size(), line)});
  for (const Arg& a : argv) {
    AddPiece({line, RespHeader('$', a.head.size() + a.tail.size(), line)});
    AddPiece(a.head);
    AddPiece(a.tail);
    AddPiece("\r\n");
  }
  ++queued_;
}

absl::Status RedisConnection::Wait(short events, absl::Time deadline, std::string_view what) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      broken_ = true;
      return absl::DeadlineExceededError(absl::StrCat("redis ", address_, ": ",
                                                      absl::string_view(what.data(), what.size()),
                                                      ": no progress by the deadline"));
    }
    const int64_t ms = std::min<int64_t>(
        absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), INT_MAX);
    pollfd p{ctx_->fd, events, 0};
    const int r = poll(&p, 1, static_cast<int>(ms));
    if (r > 0) return absl::OkStatus();  // ready, or an error the next call reports
    if (r < 0 && errno != EINTR) return SocketError(what, errno);
  }
}

absl::Status RedisConnection::SendQueued(absl::Time deadline) {
  // iovecs over the pieces, sent with sendmsg: partial sends resume where they stopped;
  // MSG_NOSIGNAL keeps a dead peer from raising SIGPIPE, MSG_DONTWAIT lets poll() bound the wait.
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
    const ssize_t sent = sendmsg(ctx_->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        KVTIER_RETURN_IF_ERROR(Wait(POLLOUT, deadline, "sending a pipeline"));
        continue;
      }
      return SocketError("sending a pipeline", errno);
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

absl::Status RedisConnection::SocketError(std::string_view what, int err) {
  broken_ = true;
  const std::string message =
      absl::StrCat("redis ", address_, ": ", absl::string_view(what.data(), what.size()), ": ",
                   err == 0 ? "connection closed by the server" : std::strerror(err));
  // SO_RCVTIMEO / SO_SNDTIMEO (redisSetTimeout) expire as EAGAIN.
  return err == EAGAIN || err == EWOULDBLOCK ? absl::DeadlineExceededError(message)
                                             : absl::UnavailableError(message);
}

absl::Status RedisConnection::RoundTrip(absl::Duration timeout,
                                        absl::FunctionRef<void(RedisReplyPtr reply)> on_reply) {
  const absl::Time deadline = absl::Now() + timeout;
  const int expected = appended_;
  appended_ = 0;
  if (broken_) {
    return absl::UnavailableError(absl::StrCat("redis ", address_, ": connection broken"));
  }
  if (queued_ > 0) {  // their relative order would be lost
    broken_ = true;
    return absl::InternalError(absl::StrCat("redis ", address_, ": Append and Queue mixed"));
  }
  // The socket timeout bounds each read and write; the polls below bound the whole round trip,
  // so a server trickling a reply a byte at a time cannot hold it (or refresh_mu, for CLUSTER
  // SLOTS) for longer. hiredis reads and writes only once poll() says the socket is ready.
  if (absl::Status s = SetTimeout(timeout); !s.ok()) {
    broken_ = true;
    return s;
  }
  for (int done = 0; done == 0;) {
    KVTIER_RETURN_IF_ERROR(Wait(POLLOUT, deadline, "sending a command"));
    if (redisBufferWrite(ctx_, &done) != REDIS_OK) {
      broken_ = true;
      return ErrorStatus("sending a command");
    }
  }
  for (int i = 0; i < expected; ++i) {
    void* reply = nullptr;
    while (true) {
      if (redisGetReplyFromReader(ctx_, &reply) != REDIS_OK) {
        broken_ = true;
        return ErrorStatus("reading replies");
      }
      if (reply != nullptr) break;
      KVTIER_RETURN_IF_ERROR(Wait(POLLIN, deadline, "reading replies"));
      if (redisBufferRead(ctx_) != REDIS_OK) {
        broken_ = true;
        return ErrorStatus("reading replies");
      }
    }
    on_reply(RedisReplyPtr(static_cast<redisReply*>(reply)));
  }
  return absl::OkStatus();
}

absl::Status RedisConnection::RoundTripQueued(
    absl::Time send_deadline, absl::Time read_deadline,
    absl::FunctionRef<BulkTarget(size_t index, int64_t length)> target,
    absl::FunctionRef<void()> on_sent,
    absl::FunctionRef<void(size_t index, const Reply& reply)> on_reply) {
  const int expected = queued_;
  queued_ = 0;
  struct Reset {
    RedisConnection* self;
    ~Reset() {
      self->small_.clear();
      self->pieces_.clear();
    }
  } reset{this};
  if (broken_) {
    return absl::UnavailableError(absl::StrCat("redis ", address_, ": connection broken"));
  }
  if (appended_ > 0) {
    broken_ = true;
    return absl::InternalError(absl::StrCat("redis ", address_, ": Append and Queue mixed"));
  }
  KVTIER_RETURN_IF_ERROR(SendQueued(send_deadline));
  on_sent();
  for (int i = 0; i < expected; ++i) {
    Reply reply;
    KVTIER_RETURN_IF_ERROR(ReadReply(static_cast<size_t>(i), target, read_deadline, &reply));
    on_reply(static_cast<size_t>(i), reply);
  }
  return absl::OkStatus();
}

absl::Status RedisConnection::ReadMore(absl::Time deadline) {
  if (rpos_ == rend_) {
    rpos_ = rend_ = 0;
  } else if (rend_ == rbuf_.size()) {
    if (rpos_ == 0) {
      broken_ = true;
      return absl::UnavailableError(
          absl::StrCat("redis ", address_, ": a reply line longer than ", rbuf_.size(), " bytes"));
    }
    std::memmove(rbuf_.data(), rbuf_.data() + rpos_, rend_ - rpos_);
    rend_ -= rpos_;
    rpos_ = 0;
  }
  while (true) {
    const ssize_t n = recv(ctx_->fd, rbuf_.data() + rend_, rbuf_.size() - rend_, MSG_DONTWAIT);
    if (n > 0) {
      rend_ += static_cast<size_t>(n);
      return absl::OkStatus();
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      KVTIER_RETURN_IF_ERROR(Wait(POLLIN, deadline, "reading replies"));
      continue;
    }
    return SocketError("reading replies", n == 0 ? 0 : errno);
  }
}

absl::Status RedisConnection::ReadLine(std::string_view* line, absl::Time deadline) {
  size_t scanned = 0;  // bytes after rpos_ known to hold no complete CRLF (ReadMore keeps them)
  while (true) {
    const char* begin = rbuf_.data() + rpos_;
    const size_t available = rend_ - rpos_;
    const void* found = std::memchr(begin + scanned, '\r', available - scanned);
    if (found != nullptr) {
      const size_t at = static_cast<size_t>(static_cast<const char*>(found) - begin);
      if (at + 1 < available) {
        if (begin[at + 1] != '\n') {
          broken_ = true;
          return absl::UnavailableError(absl::StrCat("redis ", address_, ": malformed reply line"));
        }
        *line = std::string_view(begin, at);
        rpos_ += at + 2;
        return absl::OkStatus();
      }
      scanned = at;  // a '\r' at the very end: look at it again with the next byte
    } else {
      scanned = available;
    }
    KVTIER_RETURN_IF_ERROR(ReadMore(deadline));
  }
}

absl::Status RedisConnection::ReadInto(
    absl::Span<std::byte> out, absl::Time deadline,
    const std::function<void(absl::Span<const std::byte>)>* on_bytes, size_t* read) {
  // What is buffered first, then straight from the socket into `out`.
  const size_t buffered = std::min(out.size(), rend_ - rpos_);
  if (buffered > 0) {
    std::memcpy(out.data(), rbuf_.data() + rpos_, buffered);
    if (on_bytes != nullptr && *on_bytes) (*on_bytes)(out.first(buffered));
  }
  rpos_ += buffered;
  size_t done = buffered;
  size_t unused = 0;
  if (read == nullptr) read = &unused;
  *read = done;
  while (done < out.size()) {
    const ssize_t n = recv(ctx_->fd, out.data() + done, out.size() - done, MSG_DONTWAIT);
    if (n > 0) {
      if (on_bytes != nullptr && *on_bytes) {
        (*on_bytes)(out.subspan(done, static_cast<size_t>(n)));
      }
      done += static_cast<size_t>(n);
      *read = done;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      KVTIER_RETURN_IF_ERROR(Wait(POLLIN, deadline, "reading a value"));
      continue;
    }
    return SocketError("reading a value", n == 0 ? 0 : errno);
  }
  return absl::OkStatus();
}

absl::Status RedisConnection::Skip(int64_t length, absl::Time deadline) {
  std::vector<std::byte> sink(static_cast<size_t>(std::min<int64_t>(length, 1 << 20)));
  for (int64_t left = length; left > 0;) {
    const size_t n =
        static_cast<size_t>(std::min<int64_t>(left, static_cast<int64_t>(sink.size())));
    KVTIER_RETURN_IF_ERROR(ReadInto(absl::MakeSpan(sink).first(n), deadline));
    left -= static_cast<int64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status RedisConnection::ReadReply(
    size_t index, absl::FunctionRef<BulkTarget(size_t index, int64_t length)> target,
    absl::Time deadline, Reply* reply) {
  std::string_view line;
  KVTIER_RETURN_IF_ERROR(ReadLine(&line, deadline));
  auto protocol_error = [&](std::string_view what) {
    broken_ = true;
    return absl::UnavailableError(absl::StrCat(
        "redis ", address_, ": protocol error: ", absl::string_view(what.data(), what.size())));
  };
  if (line.empty()) return protocol_error("an empty reply line");
  const std::string_view body = line.substr(1);
  auto parse_int = [&](long long* v) {
    const auto [end, ec] = std::from_chars(body.data(), body.data() + body.size(), *v);
    return ec == std::errc() && end == body.data() + body.size();
  };
  switch (line.front()) {
    case '+':
      reply->type = REDIS_REPLY_STATUS;
      reply->text = std::string(body);
      return absl::OkStatus();
    case '-':
      reply->type = REDIS_REPLY_ERROR;
      reply->text = std::string(body);
      return absl::OkStatus();
    case ':':
      reply->type = REDIS_REPLY_INTEGER;
      if (!parse_int(&reply->integer)) return protocol_error("a malformed integer reply");
      return absl::OkStatus();
    case '$':
      break;
    default:
      return protocol_error(
          absl::StrCat("unexpected reply type '", std::string(line.substr(0, 1)), "'"));
  }
  long long length = 0;
  if (!parse_int(&length) || length < -1) return protocol_error("a malformed bulk length");
  if (length > kMaxBulkBytes) {
    return protocol_error(
        absl::StrCat("a bulk string of ", length, " bytes (at most ", kMaxBulkBytes, ")"));
  }
  if (length == -1) {
    reply->type = REDIS_REPLY_NIL;
    return absl::OkStatus();
  }
  reply->type = REDIS_REPLY_STRING;
  BulkTarget where = target(index, length);
  // Bytes going into someone's buffers (and the CRLF after them) are bounded by their deadline.
  const absl::Time bulk_deadline =
      where.buffers.empty() ? deadline : std::min(deadline, where.deadline);
  // The buffers' owner gave up (its deadline passed: `s`), not this read: it is told now, and
  // the rest of the bulk is read into a sink, so the connection stays in step for the replies
  // after it (BulkTarget::on_cut). False: the error stands, and the connection is broken.
  auto cut = [&](const absl::Status& s) {
    if (!absl::IsDeadlineExceeded(s) || !where.on_cut || absl::Now() >= deadline) return false;
    broken_ = false;  // Wait marked it; the stream itself is intact
    where.on_cut(s);
    where.on_cut = nullptr;
    reply->skipped = true;
    return true;
  };
  bool delivered = false;
  if (!where.buffers.empty()) {
    int64_t total = 0;
    for (const absl::Span<std::byte>& b : where.buffers) total += static_cast<int64_t>(b.size());
    if (total != length) return protocol_error("bulk buffers do not match the value's length");
    int64_t consumed = 0;
    for (const absl::Span<std::byte>& b : where.buffers) {
      size_t got = 0;
      const absl::Status s = ReadInto(b, bulk_deadline, &where.on_bytes, &got);
      consumed += static_cast<int64_t>(got);
      if (s.ok()) continue;
      if (!cut(s)) return s;
      KVTIER_RETURN_IF_ERROR(Skip(length - consumed, deadline));
      break;
    }
    delivered = !reply->skipped;
  } else if (where.skip) {
    KVTIER_RETURN_IF_ERROR(Skip(length, deadline));
    reply->skipped = true;
  } else {
    // Kept whole: only a short reply belongs here (an error's text, a status); a bulk of a size
    // the command never answers with is refused before any memory is given to it.
    if (length > kMaxKeptBulkBytes) {
      return protocol_error(absl::StrCat("a bulk string of ", length,
                                         " bytes where a short reply was expected (at most ",
                                         kMaxKeptBulkBytes, ")"));
    }
    reply->text.resize(static_cast<size_t>(length));
    KVTIER_RETURN_IF_ERROR(
        ReadInto({reinterpret_cast<std::byte*>(reply->text.data()), reply->text.size()}, deadline));
  }
  std::array<std::byte, 2> crlf;
  size_t got = 0;
  if (absl::Status s =
          ReadInto(absl::MakeSpan(crlf), reply->skipped ? deadline : bulk_deadline, nullptr, &got);
      !s.ok()) {
    if (!delivered || !cut(s)) return s;
    KVTIER_RETURN_IF_ERROR(ReadInto(absl::MakeSpan(crlf).subspan(got), deadline));
    delivered = false;
  }
  reply->delivered = delivered;
  if (crlf[0] != std::byte{'\r'} || crlf[1] != std::byte{'\n'}) {
    return protocol_error("a bulk string not followed by CRLF");
  }
  return absl::OkStatus();
}

std::string DescribeReply(const RedisConnection::Reply& r) {
  switch (r.type) {
    case REDIS_REPLY_ERROR:
      return absl::StrCat("error: ", r.text);
    case REDIS_REPLY_STATUS:
      return absl::StrCat("status: ", r.text);
    case REDIS_REPLY_STRING:
      return "a string";
    case REDIS_REPLY_INTEGER:
      return absl::StrCat("integer ", r.integer);
    case REDIS_REPLY_NIL:
      return "nil";
    default:
      return absl::StrCat("reply type ", r.type);
  }
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
