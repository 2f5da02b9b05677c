// Redis endpoints (redis_endpoint.h): host:port parsing and connection setup.
#include "remote/redis/redis_endpoint.h"

#include <charconv>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "internal/strings.h"
#include "kvtier/redis_transport.h"

namespace kvtier {
namespace internal {

std::string RedisEndpoint::address() const {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<RedisEndpoint> ParseRedisEndpoint(std::string_view text,
                                                 std::string_view default_host,
                                                 bool server_supplied) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("redis endpoint \"", ToAbsl(text), "\": ", ToAbsl(why)));
  };
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return bad("expected host:port");
  std::string_view host = text.substr(0, colon);
  const std::string_view port_text = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos && !server_supplied) {
    return bad("an IPv6 address must be in brackets: [addr]:port");
  }
  int port = 0;
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 1 || port > 65535) {
    return bad("the port must be a number in 1..65535");
  }
  if (host.empty()) host = default_host;
  if (host.empty()) return bad("no host");
  for (const char c : host) {
    if (c <= ' ' || c == '/' || c == '@' || c == ',')
      return bad("the host has a character it cannot have");
  }
  return RedisEndpoint{std::string(host), port};
}

}  // namespace internal

absl::StatusOr<RedisTransportOptions> RedisTransportOptionsFromUrl(std::string_view url) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("redis URL \"", internal::ToAbsl(url), "\": ", internal::ToAbsl(why)));
  };
  RedisTransportOptions options;
  std::string_view rest;
  if (url.starts_with("redis://")) {
    rest = url.substr(8);
  } else if (url.starts_with("redis-cluster://")) {
    rest = url.substr(16);
    options.cluster = true;
  } else {
    return bad("expected redis://host:port[/db] or redis-cluster://host:port[,host:port...]");
  }
  // Credentials end at the last '@', so a password may contain '@'.
  const size_t at = rest.rfind('@');
  if (at != std::string_view::npos) {
    const std::string_view credentials = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = credentials.find(':');
    if (colon == std::string_view::npos) return bad("credentials must be [user]:password");
    options.username = std::string(credentials.substr(0, colon));
    options.password = std::string(credentials.substr(colon + 1));
    if (options.password.empty()) return bad("an empty password");
  }
  const size_t slash = rest.find('/');
  if (slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
    if (!db.empty()) {
      if (options.cluster) return bad("Redis Cluster has no database selection");
      int n = 0;
      const auto [end, ec] = std::from_chars(db.data(), db.data() + db.size(), n);
      if (ec != std::errc() || end != db.data() + db.size() || n < 0) {
        return bad("the database must be a number >= 0");
      }
      options.database = n;
    }
  }
  options.endpoints.clear();
  for (absl::string_view part : absl::StrSplit(internal::ToAbsl(rest), ',')) {
    absl::StatusOr<internal::RedisEndpoint> ep =
        internal::ParseRedisEndpoint(internal::ToStd(part), "");
    if (!ep.ok()) return bad(internal::ToStd(ep.status().message()));
    options.endpoints.push_back(ep->address());
  }
  if (!options.cluster && options.endpoints.size() != 1) {
    return bad("redis:// takes one host:port; use redis-cluster:// for several");
  }
  return options;
}

}  // namespace kvtier
