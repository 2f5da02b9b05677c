// A Redis server address, and the parsers for "host:port" and redis:// URLs.
#ifndef KVTIER_REMOTE_REDIS_REDIS_ENDPOINT_H_
#define KVTIER_REMOTE_REDIS_REDIS_ENDPOINT_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvtier::internal {

struct RedisEndpoint {
  std::string host;  // a name, IPv4 or IPv6 address (no brackets)
  int port = 0;
  // "host:port", "[v6]:port" for an IPv6 address.
  std::string address() const;
};

// Parses "host:port" or "[v6]:port". An empty host (Redis 7 sends ":port" in MOVED when the
// client should reuse the address it used) becomes `default_host`. `server_supplied` accepts
// what Redis itself writes in MOVED and ASK: an IPv6 address without brackets, the port after
// the last ':'. Errors: kInvalidArgument.
absl::StatusOr<RedisEndpoint> ParseRedisEndpoint(std::string_view text,
                                                 std::string_view default_host,
                                                 bool server_supplied = false);

}  // namespace kvtier::internal

#endif  // KVTIER_REMOTE_REDIS_REDIS_ENDPOINT_H_
