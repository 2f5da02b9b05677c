// The redis-server helper itself: processes come and go as promised, Pause really hangs the
// server, and a hand-formed cluster routes and reshards like a real one. Talks to the servers
// with plain hiredis where the helper's own Command() would prove nothing.
#include <errno.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"

namespace kvtier::testing {
namespace {

using ::absl::StatusCode;
using ::testing::HasSubstr;
using ::testing::StartsWith;

#define KVTIER_SKIP_WITHOUT_REDIS()                                                       \
  if (!RedisServerAvailable()) {                                                          \
    GTEST_SKIP() << "redis-server is not on PATH (Debian: apt-get install redis-server)"; \
  }

// EXPECT_THAT(status_or, IsOkAndHolds(matcher)); Debian's abseil has no status matchers.
MATCHER_P(IsOkAndHolds, matcher, "") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status().ToString();
    return false;
  }
  return ::testing::ExplainMatchResult(matcher, *arg, result_listener);
}

bool ProcessExists(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

// One command over a plain hiredis connection with `timeout` for connect and reply. The reply's
// text (status, string, error, integer) or kUnavailable with hiredis's error.
absl::StatusOr<std::string> Direct(int port, const std::vector<std::string>& argv,
                                   absl::Duration timeout = absl::Seconds(2)) {
  std::unique_ptr<redisContext, void (*)(redisContext*)> c(
      redisConnectWithTimeout("127.0.0.1", port, absl::ToTimeval(timeout)), redisFree);
  if (c == nullptr || c->err != 0) return absl::UnavailableError("connect failed");
  redisSetTimeout(c.get(), absl::ToTimeval(timeout));
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  std::unique_ptr<redisReply, void (*)(void*)> r(
      static_cast<redisReply*>(
          redisCommandArgv(c.get(), static_cast<int>(args.size()), args.data(), lens.data())),
      freeReplyObject);
  if (r == nullptr) return absl::UnavailableError(c->errstr);
  if (r->type == REDIS_REPLY_INTEGER) return absl::StrCat(r->integer);
  if (r->type == REDIS_REPLY_NIL) return std::string("(nil)");
  return std::string(r->str, r->len);
}

TEST(RedisFixtureKeySlotTest, KnownValues) {
  EXPECT_EQ(KeySlotForTest("foo"), 12182);
  EXPECT_EQ(KeySlotForTest("123456789"), 0x31C3);  // the CRC16-XMODEM check value, < 16384
  EXPECT_EQ(KeySlotForTest("{user1000}.following"), KeySlotForTest("{user1000}.followers"));
  EXPECT_EQ(KeySlotForTest("{user1000}.following"), KeySlotForTest("user1000"));
  // An empty tag does not count: the whole key is hashed.
  EXPECT_NE(KeySlotForTest("foo{}{bar}"), KeySlotForTest("bar"));
  EXPECT_EQ(KeySlotForTest("foo{{bar}}zap"), KeySlotForTest("{bar"));
}

TEST(RedisFixturePortTest, ReturnsAUsablePort) {
  KVTIER_ASSERT_OK_AND_ASSIGN(const int port, PickFreeLoopbackPort());
  EXPECT_GT(port, 0);
  EXPECT_LT(port, 65536);
}

TEST(RedisServerFixtureTest, StopLeavesNoProcessAndDestructionNoDirectory) {
  KVTIER_SKIP_WITHOUT_REDIS();
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RedisServer> server, RedisServer::Start());
  const pid_t pid = server->pid();
  const std::string dir = server->dir();
  ASSERT_GT(pid, 0);
  EXPECT_EQ(server->address(), absl::StrCat("127.0.0.1:", server->port()));
  EXPECT_THAT(server->Command({"PING"}), IsOkAndHolds(std::string("PONG")));
  EXPECT_THAT(Direct(server->port(), {"SET", "k", "v"}), IsOkAndHolds(std::string("OK")));
  EXPECT_THAT(server->Command({"GET", "k"}), IsOkAndHolds(std::string("v")));

  KVTIER_EXPECT_OK(server->Stop());
  EXPECT_FALSE(ProcessExists(pid));
  EXPECT_EQ(server->pid(), -1);
  KVTIER_EXPECT_OK(server->Stop());  // idempotent
  EXPECT_THAT(server->Command({"PING"}), IsError(StatusCode::kUnavailable, "refused"));

  server.reset();
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(RedisServerFixtureTest, DestructorLeavesNoProcess) {
  KVTIER_SKIP_WITHOUT_REDIS();
  pid_t pid = -1;
  {
    KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RedisServer> server, RedisServer::Start());
    pid = server->pid();
    ASSERT_TRUE(ProcessExists(pid));
  }
  EXPECT_FALSE(ProcessExists(pid));
}

TEST(RedisServerFixtureTest, RestartAnswersOnTheSamePort) {
  KVTIER_SKIP_WITHOUT_REDIS();
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RedisServer> server, RedisServer::Start());
  const int port = server->port();
  EXPECT_THAT(server->Restart(), IsError(StatusCode::kFailedPrecondition, "still running"));
  ASSERT_THAT(server->Command({"SET", "k", "v"}), IsOkAndHolds(std::string("OK")));

  KVTIER_ASSERT_OK(server->Stop());
  KVTIER_ASSERT_OK(server->Restart());
  EXPECT_EQ(server->port(), port);
  EXPECT_THAT(Direct(port, {"PING"}), IsOkAndHolds(std::string("PONG")));
  // Nothing is persisted.
  EXPECT_THAT(Direct(port, {"GET", "k"}), IsOkAndHolds(std::string("(nil)")));

  const pid_t crashed = server->pid();
  KVTIER_ASSERT_OK(server->Kill());
  EXPECT_FALSE(ProcessExists(crashed));
  EXPECT_THAT(Direct(port, {"PING"}), IsError(StatusCode::kUnavailable, "connect"));
  KVTIER_ASSERT_OK(server->Restart());
  EXPECT_THAT(Direct(port, {"PING"}), IsOkAndHolds(std::string("PONG")));
}

TEST(RedisServerFixtureTest, PausedServerAcceptsButNeverAnswers) {
  KVTIER_SKIP_WITHOUT_REDIS();
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RedisServer> server, RedisServer::Start());
  KVTIER_ASSERT_OK(server->Pause());
  KVTIER_ASSERT_OK(server->Pause());  // a second Pause must not wait forever
  const absl::Time start = absl::Now();
  EXPECT_THAT(Direct(server->port(), {"PING"}, absl::Milliseconds(200)),
              IsError(StatusCode::kUnavailable, "Resource temporarily unavailable"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  KVTIER_ASSERT_OK(server->Resume());
  EXPECT_THAT(Direct(server->port(), {"PING"}, absl::Milliseconds(200)),
              IsOkAndHolds(std::string("PONG")));

  // Stop() must not spend its SIGKILL grace period on a server that cannot act on SIGTERM.
  KVTIER_ASSERT_OK(server->Pause());
  const pid_t pid = server->pid();
  const absl::Time stop_start = absl::Now();
  KVTIER_ASSERT_OK(server->Stop());
  EXPECT_LT(absl::Now() - stop_start, absl::Seconds(1));
  EXPECT_FALSE(ProcessExists(pid));
}

TEST(RedisServerFixtureTest, PasswordFromExtraArgsIsUsedByTheHelper) {
  KVTIER_SKIP_WITHOUT_REDIS();
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RedisServer> server,
                              RedisServer::Start({.extra_args = {"--requirepass", "pw"}}));
  EXPECT_THAT(server->Command({"PING"}), IsOkAndHolds(std::string("PONG")));
  EXPECT_THAT(Direct(server->port(), {"PING"}), IsOkAndHolds(StartsWith("NOAUTH")));
}

TEST(RedisServerFixtureTest, BadArgumentsFailWithTheServersOwnWords) {
  KVTIER_SKIP_WITHOUT_REDIS();
  auto server = RedisServer::Start({.extra_args = {"--no-such-directive", "x"}});
  EXPECT_THAT(server, IsError(StatusCode::kFailedPrecondition, "no-such-directive"));
}

TEST(RedisServerFixtureTest, MissingBinaryIsAFailedPrecondition) {
  KVTIER_SKIP_WITHOUT_REDIS();
  const std::string path = getenv("PATH");
  setenv("PATH", "/nonexistent", 1);
  const bool available = RedisServerAvailable();
  auto server = RedisServer::Start();
  setenv("PATH", path.c_str(), 1);
  EXPECT_FALSE(available);
  EXPECT_THAT(server, IsError(StatusCode::kFailedPrecondition, "cannot execute redis-server"));
}

TEST(RedisClusterFixtureTest, FormsAndRoutesKeysToTheirOwner) {
  KVTIER_SKIP_WITHOUT_REDIS();
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RedisCluster> cluster, RedisCluster::Start(3));
  ASSERT_EQ(cluster->size(), 3);
  for (int i = 0; i < cluster->size(); ++i) {
    KVTIER_ASSERT_OK_AND_ASSIGN(const std::string info,
                                cluster->node(i).Command({"CLUSTER", "INFO"}));
    EXPECT_THAT(info, HasSubstr("cluster_state:ok"));
    EXPECT_THAT(info, HasSubstr("cluster_known_nodes:3"));
    EXPECT_THAT(info, HasSubstr("cluster_slots_assigned:16384"));
    KVTIER_ASSERT_OK_AND_ASSIGN(const std::string id, cluster->NodeId(i));
    EXPECT_EQ(id.size(), 40u);
    EXPECT_NE(cluster->node(i).cluster_port(), 0);
    EXPECT_NE(cluster->node(i).cluster_port(), cluster->node(i).port());
  }
  EXPECT_THAT(cluster->OwnerOfSlot(0), IsOkAndHolds(0));
  EXPECT_THAT(cluster->OwnerOfSlot(5461), IsOkAndHolds(1));
  EXPECT_THAT(cluster->OwnerOfSlot(16383), IsOkAndHolds(2));
  EXPECT_THAT(cluster->OwnerOfSlot(16384), IsError(StatusCode::kInvalidArgument, "16384"));

  // "foo" is in slot 12182, node 2's range; the server agrees.
  EXPECT_THAT(cluster->node(0).Command({"CLUSTER", "KEYSLOT", "foo"}),
              IsOkAndHolds(std::string("12182")));
  KVTIER_ASSERT_OK_AND_ASSIGN(const int owner, cluster->OwnerOfSlot(KeySlotForTest("foo")));
  EXPECT_EQ(owner, 2);
  EXPECT_THAT(Direct(cluster->node(owner).port(), {"SET", "foo", "bar"}),
              IsOkAndHolds(std::string("OK")));
  const int other = (owner + 1) % 3;
  EXPECT_THAT(Direct(cluster->node(other).port(), {"GET", "foo"}),
              IsOkAndHolds(absl::StrCat("MOVED 12182 ", cluster->node(owner).address())));
}

TEST(RedisClusterFixtureTest, MigratingASlotGoesThroughAskToMoved) {
  KVTIER_SKIP_WITHOUT_REDIS();
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RedisCluster> cluster, RedisCluster::Start(3));
  const std::vector<std::string> keys = {"{mig}a", "{mig}b", "{mig}c"};
  const int slot = KeySlotForTest("mig");
  KVTIER_ASSERT_OK_AND_ASSIGN(const int from, cluster->OwnerOfSlot(slot));
  const int to = (from + 1) % cluster->size();
  const RedisServer& source = cluster->node(from);
  const RedisServer& target = cluster->node(to);
  for (const std::string& k : keys) {
    ASSERT_THAT(Direct(source.port(), {"SET", k, "value of " + k}),
                IsOkAndHolds(std::string("OK")));
  }

  EXPECT_THAT(cluster->BeginMigration(slot, from), IsError(StatusCode::kInvalidArgument, "owns"));
  KVTIER_ASSERT_OK(cluster->BeginMigration(slot, to));
  KVTIER_ASSERT_OK(cluster->MigrateKeys(slot, to, 1));
  // Half-way: the moved key is answered with ASK, the others are still served by the source.
  const std::string ask = absl::StrCat("ASK ", slot, " ", target.address());
  int asked = 0;
  for (const std::string& k : keys) {
    KVTIER_ASSERT_OK_AND_ASSIGN(const std::string reply, Direct(source.port(), {"GET", k}));
    if (reply == ask) {
      ++asked;
    } else {
      EXPECT_EQ(reply, "value of " + k);
    }
  }
  EXPECT_EQ(asked, 1);
  EXPECT_THAT(cluster->OwnerOfSlot(slot), IsOkAndHolds(from));

  KVTIER_ASSERT_OK(cluster->FinishMigration(slot, to));
  EXPECT_THAT(cluster->OwnerOfSlot(slot), IsOkAndHolds(to));
  const std::string moved = absl::StrCat("MOVED ", slot, " ", target.address());
  for (const std::string& k : keys) {
    EXPECT_THAT(Direct(target.port(), {"GET", k}), IsOkAndHolds("value of " + k));
    EXPECT_THAT(Direct(source.port(), {"GET", k}), IsOkAndHolds(moved));
  }
  const int third = (to + 1) % cluster->size();
  EXPECT_THAT(Direct(cluster->node(third).port(), {"GET", keys[0]}), IsOkAndHolds(moved));
  EXPECT_THAT(cluster->node(to).Command({"CLUSTER", "COUNTKEYSINSLOT", absl::StrCat(slot)}),
              IsOkAndHolds(std::string("3")));
}

}  // namespace
}  // namespace kvtier::testing
