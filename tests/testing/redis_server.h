// Real redis-server processes for tests and benchmarks: one server (RedisServer) or a Redis
// Cluster of them formed by hand (RedisCluster), each on free loopback ports with its own
// temporary directory, and nothing left running once the object is destroyed.
//
// Why real servers: the remote tier's failure handling (refused connections, hung servers,
// MOVED/ASK during resharding) can only be exercised honestly against the real thing.
//
// Process model: the server is a child of the test process (fork + exec), in its own process
// group so a terminal's Ctrl-C reaches only the test, and with PR_SET_PDEATHSIG(SIGKILL) so it
// dies with the test process even when that crashes or is killed by a ctest timeout. Linux sends
// that signal when the *thread* that forked exits, so call Start()/Restart() from a thread that
// outlives the server (the main thread in GoogleTest and Google Benchmark).
//
// Nothing is persisted (--save '', --appendonly no): a restarted server is empty; a restarted
// cluster node keeps its node id and slots through nodes.conf in its directory.
//
// Thread safety: none for the mutating calls (Start/Stop/Kill/Restart/Pause/Resume, the
// migration steps). The const calls (Command, NodeId, OwnerOfSlot, accessors) each open their
// own connection and may run concurrently with each other.
#ifndef KVTIER_TESTS_TESTING_REDIS_SERVER_H_
#define KVTIER_TESTS_TESTING_REDIS_SERVER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvtier::testing {

class TempDir;

// A TCP port on 127.0.0.1 that was free a moment ago (bind port 0, getsockname, close). Another
// process may take it before it is used: callers retry with a new one. kInternal if the socket
// calls fail.
absl::StatusOr<int> PickFreeLoopbackPort();

// True if an executable `redis-server` is on PATH. Tests GTEST_SKIP() with a message otherwise.
bool RedisServerAvailable();

// The hash slot (0..16383) Redis Cluster computes for `key`: CRC16-XMODEM of the key, or of the
// text between the first '{' and the next '}' when that is non-empty, modulo 16384. Tests use it
// to choose keys; the library has its own implementation, checked against this one.
int KeySlotForTest(std::string_view key);

struct RedisServerOptions {
  // --cluster-enabled yes with nodes.conf in the server's directory, --cluster-node-timeout 2000,
  // and its own --cluster-port: a second free port, because the default port+10000 can exceed
  // 65535 for ports bind(0) hands out.
  bool cluster = false;
  // Appended to the command line, e.g. {"--requirepass", "pw"}. With --requirepass, the helper's
  // own connections (readiness check, Command) authenticate with that password.
  std::vector<std::string> extra_args;
};

// One redis-server on 127.0.0.1. States: running (pid() > 0, maybe paused) or stopped (pid() ==
// -1, after Stop/Kill or a crash it noticed); Restart() goes from stopped to running.
class RedisServer {
 public:
  // Starts redis-server on a free port with a fresh temporary directory (log in dir()/log, the
  // child's stdout/stderr in dir()/stdout) and returns once it answers on that port. If the port
  // was taken meanwhile ("Address already in use", or another server answers there), retries
  // with new ports, 3 attempts in all.
  // Errors: kUnavailable if every attempt met a taken port; kFailedPrecondition if redis-server
  // cannot be executed or exits for another reason (e.g. a bad extra_args directive);
  // kDeadlineExceeded if it did not answer within 5 s; kInternal for failing system calls. The
  // message ends with the tail of the server's log and stderr.
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start(RedisServerOptions options = {});

  // SIGKILLs the server and removes its directory; runs when a test fails, too. Not a graceful
  // Stop(): the directory goes anyway, and SIGTERM costs about 100 ms per server (redis-server
  // acts on it in its 10 Hz cron).
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  int cluster_port() const { return cluster_port_; }  // 0 unless options.cluster
  const std::string& dir() const;
  pid_t pid() const { return pid_; }  // -1 when stopped
  std::string address() const;        // "127.0.0.1:<port>"
  const RedisServerOptions& options() const { return options_; }

  // Graceful stop: SIGTERM (and SIGCONT, so a paused server can act on it), wait up to 2 s for it
  // to exit (about 100 ms), then SIGKILL. OK if already stopped.
  absl::Status Stop();
  // A crash: SIGKILL, then reap. OK if already stopped.
  absl::Status Kill();
  // Starts the server again on the same port and directory (same node id for a cluster node) and
  // returns once it answers. kFailedPrecondition if it is still running; otherwise the errors of
  // Start(), without retries: the port is the point (kUnavailable: someone else took it). A
  // restarted cluster node answers at once but, like any master, reports cluster_state:fail
  // (CLUSTERDOWN replies) for its first 2 s.
  absl::Status Restart();
  // SIGSTOP, returning once the process is stopped: a hung server whose connections the kernel
  // still accepts but which never answers. kFailedPrecondition if stopped.
  absl::Status Pause();
  // SIGCONT, returning once the process runs again. kFailedPrecondition if stopped.
  absl::Status Resume();

  // Runs one command on a fresh connection (2 s to connect, 10 s for the reply) and returns the
  // reply as text: a status, string or error reply as its text (so "MOVED 866 127.0.0.1:P" comes
  // back as a value, not an error), an integer in decimal, nil as "", an array as its elements
  // (flattened) joined by '\n'. kUnavailable if the server cannot be reached or does not answer.
  // For test setup and inspection, e.g. Command({"CLUSTER", "INFO"}).
  absl::StatusOr<std::string> Command(const std::vector<std::string>& argv) const;

 private:
  explicit RedisServer(RedisServerOptions options);
  // Forks and execs the server on port_/cluster_port_ and waits until it answers.
  absl::Status Launch();
  std::vector<std::string> CommandLine() const;
  // Sends `sig` to the server's process group (the server and anything it forked).
  void Signal(int sig) const;
  // Reaps the child if it exits before `timeout_ms`; true if it did.
  bool WaitForExit(int timeout_ms);
  std::string LogTail() const;

  RedisServerOptions options_;
  std::string password_;  // the --requirepass value in options_.extra_args, or ""
  std::unique_ptr<TempDir> dir_;
  int port_ = 0;
  int cluster_port_ = 0;
  pid_t pid_ = -1;
  bool paused_ = false;  // SIGSTOPped by Pause(): a second wait for the stop would never return
};

// A Redis Cluster of `size()` masters (no replicas), each a RedisServer with cluster = true, the
// 16384 slots split evenly in order (node 0 has the lowest). Formed by hand, which is faster than
// redis-cli --cluster create: distinct config epochs, CLUSTER ADDSLOTSRANGE on each node, CLUSTER
// MEET between every pair, then waiting until every node reports cluster_state:ok and the same
// slot owners. Takes about 2.1 s, nearly all of it redis-server's CLUSTER_WRITABLE_DELAY (a master
// waits 2 s after start before it reports cluster_state:ok): share one cluster across a suite
// where the tests allow it.
//
// Resharding a slot is three steps, as redis-cli --cluster reshard does it, so a test can act
// between them (e.g. see ASK while keys are half moved): BeginMigration, MigrateKeys (any number
// of times), FinishMigration.
class RedisCluster {
 public:
  // `nodes` >= 1. Errors: kInvalidArgument for nodes < 1; those of RedisServer::Start; a failing
  // cluster command as kInternal; kDeadlineExceeded if the cluster does not agree within 10 s.
  static absl::StatusOr<std::unique_ptr<RedisCluster>> Start(int nodes = 3);

  RedisServer& node(int i) { return *nodes_[static_cast<size_t>(i)]; }
  const RedisServer& node(int i) const { return *nodes_[static_cast<size_t>(i)]; }
  int size() const { return static_cast<int>(nodes_.size()); }
  std::vector<std::string> addresses() const;  // "127.0.0.1:<port>" of each node, by index

  // CLUSTER MYID of node i (40 hex characters).
  absl::StatusOr<std::string> NodeId(int i) const;
  // Index of the node that owns `slot` according to node 0's CLUSTER SLOTS (during a migration:
  // the source). kNotFound if the slot is unassigned or owned by an unknown node.
  absl::StatusOr<int> OwnerOfSlot(int slot) const;

  // CLUSTER SETSLOT IMPORTING on node `to`, then MIGRATING on the slot's owner.
  // kInvalidArgument for a bad slot or index or when `to` already owns the slot.
  absl::Status BeginMigration(int slot, int to);
  // Moves up to `max_keys` (> 0) of the slot's keys from the owner to node `to` (CLUSTER
  // GETKEYSINSLOT, then MIGRATE ... KEYS). OK with nothing to move.
  absl::Status MigrateKeys(int slot, int to, int max_keys);
  // Moves the keys still left, then CLUSTER SETSLOT slot NODE <to's id> on `to`, on the old owner
  // and on every other node, and waits (up to 10 s) until every node reports `to` as the owner.
  absl::Status FinishMigration(int slot, int to);

 private:
  RedisCluster() = default;
  // Every node's CLUSTER SLOTS agrees with `owner_ports` (16384 ports) and CLUSTER INFO says
  // cluster_state:ok, within 10 s; kDeadlineExceeded with the last disagreement otherwise.
  absl::Status WaitForAgreement(const std::vector<int>& owner_ports) const;
  absl::Status CheckSlotAndNode(int slot, int to) const;

  std::vector<std::unique_ptr<RedisServer>> nodes_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_REDIS_SERVER_H_
