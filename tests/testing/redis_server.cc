#include "tests/testing/redis_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "internal/status_macros.h"
#include "tests/testing/temp_dir.h"

namespace kvtier::testing {
namespace {

constexpr int kNumSlots = 16384;
constexpr int kStartAttempts = 3;
constexpr absl::Duration kStartTimeout = absl::Seconds(5);
constexpr absl::Duration kPollInterval = absl::Milliseconds(20);
constexpr absl::Duration kClusterTimeout = absl::Seconds(10);
constexpr absl::Duration kConnectTimeout = absl::Seconds(2);
constexpr absl::Duration kReplyTimeout = absl::Seconds(10);
// execvp failing in the child; the shell's "command not found".
constexpr int kExecFailedExitCode = 127;

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;
struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;

absl::Status ErrnoStatus(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
}

absl::StatusOr<Context> Connect(int port, absl::Duration connect_timeout,
                                absl::Duration reply_timeout) {
  Context c(redisConnectWithTimeout("127.0.0.1", port, absl::ToTimeval(connect_timeout)));
  if (c == nullptr) return absl::ResourceExhaustedError("redisConnectWithTimeout: out of memory");
  if (c->err != 0) {
    return absl::UnavailableError(absl::StrCat("connect 127.0.0.1:", port, ": ", c->errstr));
  }
  if (redisSetTimeout(c.get(), absl::ToTimeval(reply_timeout)) != REDIS_OK) {
    return absl::InternalError(absl::StrCat("redisSetTimeout: ", c->errstr));
  }
  return c;
}

absl::StatusOr<Reply> Send(redisContext* c, const std::vector<std::string>& argv) {
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  Reply r(static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(args.size()), args.data(), lens.data())));
  if (r == nullptr) {
    // hiredis 0.14 reports a read timeout as an I/O error ("Resource temporarily unavailable").
    return absl::UnavailableError(
        absl::StrCat(argv.empty() ? "" : argv[0], " on port ", c->tcp.port, ": ", c->errstr));
  }
  return r;
}

// One command on a fresh connection, after AUTH when `password` is set.
absl::StatusOr<Reply> RunOnPort(int port, const std::string& password,
                                const std::vector<std::string>& argv,
                                absl::Duration connect_timeout = kConnectTimeout,
                                absl::Duration reply_timeout = kReplyTimeout) {
  KVTIER_ASSIGN_OR_RETURN(Context c, Connect(port, connect_timeout, reply_timeout));
  if (!password.empty()) {
    KVTIER_ASSIGN_OR_RETURN(Reply auth, Send(c.get(), {"AUTH", password}));
    if (auth->type == REDIS_REPLY_ERROR) {
      return absl::PermissionDeniedError(absl::StrCat("AUTH on port ", port, ": ", auth->str));
    }
  }
  return Send(c.get(), argv);
}

void AppendReplyText(const redisReply& r, std::string* out) {
  switch (r.type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
      out->append(r.str, r.len);
      break;
    case REDIS_REPLY_INTEGER:
      absl::StrAppend(out, r.integer);
      break;
    case REDIS_REPLY_ARRAY:
      for (size_t i = 0; i < r.elements; ++i) {
        if (i > 0) out->push_back('\n');
        AppendReplyText(*r.element[i], out);
      }
      break;
    default:  // nil
      break;
  }
}

std::string FileTail(const std::string& path, std::streamoff max_bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return "";
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  f.seekg(std::max<std::streamoff>(0, size - max_bytes));
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return absl::StrCat("wait status ", status);
}

enum class Probe { kNotYet, kUp, kForeign };

// Whether the server with process id `pid` answers on `port`. INFO's process_id tells our server
// from another one that took the port between PickFreeLoopbackPort() and the server's bind().
Probe ProbeServer(int port, const std::string& password, pid_t pid) {
  absl::StatusOr<Reply> r = RunOnPort(port, password, {"INFO", "server"}, absl::Milliseconds(200),
                                      absl::Milliseconds(500));
  if (!r.ok()) {
    // An AUTH failure is an answer: the password is wrong, but the server is up.
    return r.status().code() == absl::StatusCode::kPermissionDenied ? Probe::kUp : Probe::kNotYet;
  }
  const absl::string_view text((*r)->str != nullptr ? (*r)->str : "", (*r)->len);
  if ((*r)->type == REDIS_REPLY_ERROR) {
    // NOAUTH (a password set some other way) cannot be verified further but is an answer.
    return absl::StartsWith(text, "LOADING") ? Probe::kNotYet : Probe::kUp;
  }
  constexpr absl::string_view kField = "process_id:";
  const size_t at = text.find(kField);
  if (at == absl::string_view::npos) return Probe::kUp;
  const size_t begin = at + kField.size();
  const absl::string_view digits = text.substr(begin, text.find_first_of("\r\n", begin) - begin);
  int answered_pid = 0;
  if (!absl::SimpleAtoi(digits, &answered_pid)) return Probe::kUp;
  return answered_pid == pid ? Probe::kUp : Probe::kForeign;
}

uint16_t Crc16Xmodem(std::string_view data) {
  uint16_t crc = 0;
  for (const char ch : data) {
    crc = static_cast<uint16_t>(crc ^ (static_cast<uint8_t>(ch) << 8));
    for (int bit = 0; bit < 8; ++bit) {
      crc = static_cast<uint16_t>((crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
  }
  return crc;
}

}  // namespace

absl::StatusOr<int> PickFreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    absl::Status s = ErrnoStatus("bind/getsockname 127.0.0.1:0");
    close(fd);
    return s;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

bool RedisServerAvailable() {
  const char* path = getenv("PATH");
  if (path == nullptr) return false;
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/redis-server");
    if (access(candidate.c_str(), X_OK) == 0) return true;
  }
  return false;
}

int KeySlotForTest(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return Crc16Xmodem(key) & (kNumSlots - 1);
}

// ---- RedisServer ----

RedisServer::RedisServer(RedisServerOptions options)
    : options_(std::move(options)), dir_(std::make_unique<TempDir>()) {
  const auto& args = options_.extra_args;
  const auto it = std::find(args.begin(), args.end(), "--requirepass");
  if (it != args.end() && it + 1 != args.end()) password_ = *(it + 1);
}

RedisServer::~RedisServer() { Kill().IgnoreError(); }

const std::string& RedisServer::dir() const { return dir_->path(); }

std::string RedisServer::address() const { return absl::StrCat("127.0.0.1:", port_); }

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start(RedisServerOptions options) {
  std::unique_ptr<RedisServer> server(new RedisServer(std::move(options)));
  if (server->dir().empty()) return ErrnoStatus("mkdtemp");
  absl::Status last;
  for (int attempt = 0; attempt < kStartAttempts; ++attempt) {
    KVTIER_ASSIGN_OR_RETURN(server->port_, PickFreeLoopbackPort());
    if (server->options_.cluster) {
      do {
        KVTIER_ASSIGN_OR_RETURN(server->cluster_port_, PickFreeLoopbackPort());
      } while (server->cluster_port_ == server->port_);
    }
    last = server->Launch();
    if (last.ok()) return server;
    // Only a taken port is worth another port.
    if (last.code() != absl::StatusCode::kUnavailable) return last;
    // The next attempt's log tail should be its own; a stale nodes.conf would carry old ports.
    for (const char* name : {"log", "stdout", "nodes.conf"}) {
      std::error_code ec;
      std::filesystem::remove(server->dir_->File(name), ec);
    }
  }
  return absl::UnavailableError(absl::StrCat("redis-server did not start in ", kStartAttempts,
                                             " attempts; last: ", last.message()));
}

std::vector<std::string> RedisServer::CommandLine() const {
  std::vector<std::string> args = {"redis-server",
                                   "--port",
                                   absl::StrCat(port_),
                                   "--bind",
                                   "127.0.0.1",
                                   "--save",
                                   "",
                                   "--appendonly",
                                   "no",
                                   "--dir",
                                   dir(),
                                   "--logfile",
                                   dir_->File("log"),
                                   "--daemonize",
                                   "no",
                                   "--enable-debug-command",
                                   "yes"};
  if (options_.cluster) {
    args.insert(args.end(), {"--cluster-enabled", "yes", "--cluster-port",
                             absl::StrCat(cluster_port_), "--cluster-config-file",
                             dir_->File("nodes.conf"), "--cluster-node-timeout", "2000"});
  }
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  return args;
}

absl::Status RedisServer::Launch() {
  // Everything the child needs is prepared here: between fork and exec it may only make
  // async-signal-safe calls (the test process may have other threads holding malloc's locks).
  const std::vector<std::string> args = CommandLine();
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::string out_path = dir_->File("stdout");
  const int out_fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (out_fd < 0) return ErrnoStatus(absl::StrCat("open ", out_path));
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) {
    absl::Status s = ErrnoStatus("open /dev/null");
    close(out_fd);
    return s;
  }
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) {
    absl::Status s = ErrnoStatus("fork");
    close(out_fd);
    close(null_fd);
    return s;
  }
  if (child == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // the test died before prctl took effect
    dup2(null_fd, STDIN_FILENO);
    dup2(out_fd, STDOUT_FILENO);
    dup2(out_fd, STDERR_FILENO);
    // hiredis sockets are not close-on-exec: an inherited client socket would keep another
    // server's connection open after the test closed it.
    close_range(3, ~0U, 0);
    execvp(argv[0], argv.data());
    _exit(kExecFailedExitCode);
  }
  // Also here, so that Signal() can address the group before the child has run at all.
  setpgid(child, child);
  close(out_fd);
  close(null_fd);
  pid_ = child;

  const absl::Time deadline = absl::Now() + kStartTimeout;
  while (true) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      if (WIFEXITED(status) && WEXITSTATUS(status) == kExecFailedExitCode) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot execute redis-server (is it on PATH?)", LogTail()));
      }
      const std::string tail = LogTail();
      const std::string message =
          absl::StrCat("redis-server on port ", port_, " ", DescribeWaitStatus(status), tail);
      // The server logs "Could not create server TCP listening socket ...: bind: Address already
      // in use" (or the same for the cluster bus port).
      return absl::StrContains(tail, "already in use") ? absl::UnavailableError(message)
                                                       : absl::FailedPreconditionError(message);
    }
    switch (ProbeServer(port_, password_, pid_)) {
      case Probe::kUp:
        return absl::OkStatus();
      case Probe::kForeign:
        Kill().IgnoreError();
        return absl::UnavailableError(
            absl::StrCat("port ", port_, " was taken by another redis-server", LogTail()));
      case Probe::kNotYet:
        break;
    }
    if (absl::Now() > deadline) {
      const std::string tail = LogTail();
      Kill().IgnoreError();
      return absl::DeadlineExceededError(absl::StrCat("redis-server on port ", port_,
                                                      " did not answer within ",
                                                      absl::FormatDuration(kStartTimeout), tail));
    }
    absl::SleepFor(kPollInterval);
  }
}

void RedisServer::Signal(int sig) const {
  if (pid_ <= 0) return;
  if (kill(-pid_, sig) != 0) kill(pid_, sig);
}

bool RedisServer::WaitForExit(int timeout_ms) {
  const absl::Time deadline = absl::Now() + absl::Milliseconds(timeout_ms);
  while (pid_ > 0) {
    const pid_t r = waitpid(pid_, nullptr, timeout_ms < 0 ? 0 : WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      pid_ = -1;
      paused_ = false;
      return true;
    }
    if (r < 0 && errno == EINTR) continue;
    if (timeout_ms >= 0 && absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

absl::Status RedisServer::Stop() {
  if (pid_ <= 0) return absl::OkStatus();
  Signal(SIGTERM);
  Signal(SIGCONT);  // a paused server acts on SIGTERM only once it runs
  if (!WaitForExit(2000)) {
    Signal(SIGKILL);
    WaitForExit(-1);
  }
  return absl::OkStatus();
}

absl::Status RedisServer::Kill() {
  if (pid_ <= 0) return absl::OkStatus();
  Signal(SIGKILL);
  WaitForExit(-1);
  return absl::OkStatus();
}

absl::Status RedisServer::Restart() {
  if (pid_ > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("redis-server on port ", port_, " is still running (pid ", pid_, ")"));
  }
  return Launch();
}

absl::Status RedisServer::Pause() {
  if (pid_ <= 0) return absl::FailedPreconditionError("redis-server is not running");
  if (paused_) return absl::OkStatus();  // a second WUNTRACED wait would block forever
  Signal(SIGSTOP);
  int status = 0;
  if (waitpid(pid_, &status, WUNTRACED) != pid_) return ErrnoStatus("waitpid(WUNTRACED)");
  if (!WIFSTOPPED(status)) {
    pid_ = -1;
    return absl::UnavailableError(absl::StrCat("redis-server ", DescribeWaitStatus(status)));
  }
  paused_ = true;
  return absl::OkStatus();
}

absl::Status RedisServer::Resume() {
  if (pid_ <= 0) return absl::FailedPreconditionError("redis-server is not running");
  if (!paused_) return absl::OkStatus();
  Signal(SIGCONT);
  int status = 0;
  if (waitpid(pid_, &status, WCONTINUED) != pid_) return ErrnoStatus("waitpid(WCONTINUED)");
  paused_ = false;
  if (!WIFCONTINUED(status)) {
    pid_ = -1;
    return absl::UnavailableError(absl::StrCat("redis-server ", DescribeWaitStatus(status)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RedisServer::Command(const std::vector<std::string>& argv) const {
  KVTIER_ASSIGN_OR_RETURN(Reply r, RunOnPort(port_, password_, argv));
  std::string text;
  AppendReplyText(*r, &text);
  return text;
}

std::string RedisServer::LogTail() const {
  std::string tail;
  for (const char* name : {"log", "stdout"}) {
    const std::string text = FileTail(dir_->File(name), 2000);
    if (!text.empty()) absl::StrAppend(&tail, "\n", dir_->File(name), " ends:\n", text);
  }
  return tail.empty() ? "; its log and stdout/stderr are empty" : absl::StrCat(";", tail);
}

// ---- RedisCluster ----

namespace {

// Runs `argv` on `node` (cluster nodes have no password); an error reply becomes kInternal
// naming the command and the node.
absl::StatusOr<Reply> NodeOk(const RedisServer& node, const std::vector<std::string>& argv) {
  KVTIER_ASSIGN_OR_RETURN(Reply r, RunOnPort(node.port(), "", argv));
  if (r->type == REDIS_REPLY_ERROR) {
    return absl::InternalError(absl::StrCat(absl::StrJoin(argv, " "), " on ", node.address(), ": ",
                                            absl::string_view(r->str, r->len)));
  }
  return r;
}

absl::Status NodeDo(const RedisServer& node, const std::vector<std::string>& argv) {
  return NodeOk(node, argv).status();
}

// The port of each slot's owner (0: unassigned) as `node` sees it.
absl::StatusOr<std::vector<int>> SlotOwnerPorts(const RedisServer& node) {
  KVTIER_ASSIGN_OR_RETURN(Reply r, NodeOk(node, {"CLUSTER", "SLOTS"}));
  if (r->type != REDIS_REPLY_ARRAY) return absl::InternalError("CLUSTER SLOTS: not an array");
  std::vector<int> owners(kNumSlots, 0);
  // Each range: [start, end, [ip, port, id, ...] of the master, replicas...].
  for (size_t i = 0; i < r->elements; ++i) {
    const redisReply& range = *r->element[i];
    if (range.type != REDIS_REPLY_ARRAY || range.elements < 3 ||
        range.element[0]->type != REDIS_REPLY_INTEGER ||
        range.element[1]->type != REDIS_REPLY_INTEGER ||
        range.element[2]->type != REDIS_REPLY_ARRAY || range.element[2]->elements < 2 ||
        range.element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
      return absl::InternalError(
          absl::StrCat("CLUSTER SLOTS on ", node.address(), ": unexpected shape of range ", i));
    }
    const long long lo = range.element[0]->integer;
    const long long hi = range.element[1]->integer;
    if (lo < 0 || hi >= kNumSlots || lo > hi) {
      return absl::InternalError(absl::StrCat("CLUSTER SLOTS: bad range ", lo, "-", hi));
    }
    const int port = static_cast<int>(range.element[2]->element[1]->integer);
    std::fill(owners.begin() + lo, owners.begin() + hi + 1, port);
  }
  return owners;
}

// Moves up to `max_keys` keys of `slot` from `from` to `to`; returns how many it moved.
absl::StatusOr<size_t> MoveKeys(const RedisServer& from, const RedisServer& to, int slot,
                                int max_keys) {
  KVTIER_ASSIGN_OR_RETURN(Reply keys, NodeOk(from, {"CLUSTER", "GETKEYSINSLOT", absl::StrCat(slot),
                                                    absl::StrCat(max_keys)}));
  if (keys->type != REDIS_REPLY_ARRAY) return absl::InternalError("GETKEYSINSLOT: not an array");
  if (keys->elements == 0) return 0;
  std::vector<std::string> migrate = {"MIGRATE", "127.0.0.1", absl::StrCat(to.port()), "", "0",
                                      "5000",    "KEYS"};
  for (size_t i = 0; i < keys->elements; ++i) {
    migrate.emplace_back(keys->element[i]->str, keys->element[i]->len);
  }
  KVTIER_RETURN_IF_ERROR(NodeDo(from, migrate));
  return keys->elements;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisCluster>> RedisCluster::Start(int nodes) {
  if (nodes < 1) return absl::InvalidArgumentError(absl::StrCat("nodes = ", nodes, " < 1"));
  std::unique_ptr<RedisCluster> cluster(new RedisCluster());
  for (int i = 0; i < nodes; ++i) {
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<RedisServer> node,
                            RedisServer::Start({.cluster = true}));
    cluster->nodes_.push_back(std::move(node));
  }
  std::vector<int> owner_ports(kNumSlots, 0);
  for (int i = 0; i < nodes; ++i) {
    const RedisServer& node = cluster->node(i);
    // Distinct epochs, as redis-cli sets them: otherwise the nodes first have to resolve the
    // collision of all starting at epoch 0.
    KVTIER_RETURN_IF_ERROR(NodeDo(node, {"CLUSTER", "SET-CONFIG-EPOCH", absl::StrCat(i + 1)}));
    const int lo = i * kNumSlots / nodes;
    const int hi = (i + 1) * kNumSlots / nodes - 1;
    KVTIER_RETURN_IF_ERROR(
        NodeDo(node, {"CLUSTER", "ADDSLOTSRANGE", absl::StrCat(lo), absl::StrCat(hi)}));
    std::fill(owner_ports.begin() + lo, owner_ports.begin() + hi + 1, node.port());
  }
  // Every pair meets directly: with MEETs from node 0 only, the others learn of each other by
  // gossip, and about one formation in five then took 3-4 s instead of 2 s.
  for (int i = 0; i < nodes; ++i) {
    for (int j = i + 1; j < nodes; ++j) {
      const RedisServer& node = cluster->node(j);
      KVTIER_RETURN_IF_ERROR(
          NodeDo(cluster->node(i), {"CLUSTER", "MEET", "127.0.0.1", absl::StrCat(node.port()),
                                    absl::StrCat(node.cluster_port())}));
    }
  }
  KVTIER_RETURN_IF_ERROR(cluster->WaitForAgreement(owner_ports));
  return cluster;
}

std::vector<std::string> RedisCluster::addresses() const {
  std::vector<std::string> out;
  for (const auto& n : nodes_) out.push_back(n->address());
  return out;
}

absl::StatusOr<std::string> RedisCluster::NodeId(int i) const {
  if (i < 0 || i >= size()) return absl::InvalidArgumentError(absl::StrCat("no node ", i));
  KVTIER_ASSIGN_OR_RETURN(Reply r, NodeOk(node(i), {"CLUSTER", "MYID"}));
  return std::string(r->str, r->len);
}

absl::StatusOr<int> RedisCluster::OwnerOfSlot(int slot) const {
  if (slot < 0 || slot >= kNumSlots) {
    return absl::InvalidArgumentError(absl::StrCat("slot ", slot, " outside 0..16383"));
  }
  KVTIER_ASSIGN_OR_RETURN(std::vector<int> owners, SlotOwnerPorts(node(0)));
  const int port = owners[static_cast<size_t>(slot)];
  for (int i = 0; i < size(); ++i) {
    if (node(i).port() == port) return i;
  }
  return absl::NotFoundError(absl::StrCat("slot ", slot, " has no known owner (port ", port, ")"));
}

absl::Status RedisCluster::CheckSlotAndNode(int slot, int to) const {
  if (slot < 0 || slot >= kNumSlots) {
    return absl::InvalidArgumentError(absl::StrCat("slot ", slot, " outside 0..16383"));
  }
  if (to < 0 || to >= size()) return absl::InvalidArgumentError(absl::StrCat("no node ", to));
  return absl::OkStatus();
}

absl::Status RedisCluster::BeginMigration(int slot, int to) {
  KVTIER_RETURN_IF_ERROR(CheckSlotAndNode(slot, to));
  KVTIER_ASSIGN_OR_RETURN(const int from, OwnerOfSlot(slot));
  if (from == to) {
    return absl::InvalidArgumentError(absl::StrCat("node ", to, " already owns slot ", slot));
  }
  KVTIER_ASSIGN_OR_RETURN(const std::string from_id, NodeId(from));
  KVTIER_ASSIGN_OR_RETURN(const std::string to_id, NodeId(to));
  const std::string s = absl::StrCat(slot);
  KVTIER_RETURN_IF_ERROR(NodeDo(node(to), {"CLUSTER", "SETSLOT", s, "IMPORTING", from_id}));
  KVTIER_RETURN_IF_ERROR(NodeDo(node(from), {"CLUSTER", "SETSLOT", s, "MIGRATING", to_id}));
  return absl::OkStatus();
}

absl::Status RedisCluster::MigrateKeys(int slot, int to, int max_keys) {
  KVTIER_RETURN_IF_ERROR(CheckSlotAndNode(slot, to));
  if (max_keys <= 0) return absl::InvalidArgumentError(absl::StrCat("max_keys = ", max_keys));
  KVTIER_ASSIGN_OR_RETURN(const int from, OwnerOfSlot(slot));
  if (from == to) {
    return absl::InvalidArgumentError(absl::StrCat("node ", to, " already owns slot ", slot));
  }
  return MoveKeys(node(from), node(to), slot, max_keys).status();
}

absl::Status RedisCluster::FinishMigration(int slot, int to) {
  KVTIER_RETURN_IF_ERROR(CheckSlotAndNode(slot, to));
  KVTIER_ASSIGN_OR_RETURN(const int from, OwnerOfSlot(slot));
  if (from == to) {
    return absl::InvalidArgumentError(absl::StrCat("node ", to, " already owns slot ", slot));
  }
  // The old owner refuses SETSLOT NODE while it still holds keys of the slot.
  while (true) {
    KVTIER_ASSIGN_OR_RETURN(const size_t moved, MoveKeys(node(from), node(to), slot, 100));
    if (moved == 0) break;
  }
  KVTIER_ASSIGN_OR_RETURN(std::vector<int> expected, SlotOwnerPorts(node(0)));
  expected[static_cast<size_t>(slot)] = node(to).port();
  KVTIER_ASSIGN_OR_RETURN(const std::string to_id, NodeId(to));
  const std::vector<std::string> setslot = {"CLUSTER", "SETSLOT", absl::StrCat(slot), "NODE",
                                            to_id};
  // Target first (it bumps its epoch, so its claim wins in gossip), then the old owner (which
  // starts answering MOVED), then the rest, as the Redis docs order it.
  KVTIER_RETURN_IF_ERROR(NodeDo(node(to), setslot));
  KVTIER_RETURN_IF_ERROR(NodeDo(node(from), setslot));
  for (int i = 0; i < size(); ++i) {
    if (i == to || i == from) continue;
    KVTIER_RETURN_IF_ERROR(NodeDo(node(i), setslot));
  }
  return WaitForAgreement(expected);
}

absl::Status RedisCluster::WaitForAgreement(const std::vector<int>& owner_ports) const {
  const absl::Time deadline = absl::Now() + kClusterTimeout;
  std::string last;
  while (true) {
    bool agreed = true;
    for (int i = 0; i < size() && agreed; ++i) {
      absl::StatusOr<std::string> info = node(i).Command({"CLUSTER", "INFO"});
      if (!info.ok()) {
        last = std::string(info.status().message());
        agreed = false;
        break;
      }
      if (!absl::StrContains(*info, "cluster_state:ok")) {
        last = absl::StrCat("node ", i, " is not cluster_state:ok");
        agreed = false;
        break;
      }
      absl::StatusOr<std::vector<int>> owners = SlotOwnerPorts(node(i));
      if (!owners.ok()) {
        last = std::string(owners.status().message());
        agreed = false;
        break;
      }
      const auto mismatch = std::mismatch(owners->begin(), owners->end(), owner_ports.begin());
      if (mismatch.first != owners->end()) {
        last = absl::StrCat("node ", i, " sees slot ", mismatch.first - owners->begin(),
                            " at port ", *mismatch.first, ", want ", *mismatch.second);
        agreed = false;
      }
    }
    if (agreed) return absl::OkStatus();
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "cluster did not agree within ", absl::FormatDuration(kClusterTimeout), ": ", last));
    }
    absl::SleepFor(kPollInterval);
  }
}

}  // namespace kvtier::testing
