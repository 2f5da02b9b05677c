// The Redis Cluster hash slot of a key: CRC16 (XMODEM: polynomial 0x1021, initial value 0) of the
// key, or of the part between the first '{' and the next '}' when that part is non-empty, modulo
// 16384. Source: the Redis Cluster specification, "Keys distribution model" and its Appendix A.
#ifndef KVTIER_REMOTE_REDIS_KEY_SLOT_H_
#define KVTIER_REMOTE_REDIS_KEY_SLOT_H_

#include <cstdint>
#include <string_view>

namespace kvtier::internal {

inline constexpr int kRedisClusterSlots = 16384;

uint16_t Crc16Xmodem(std::string_view bytes);
int RedisKeySlot(std::string_view key);

}  // namespace kvtier::internal

#endif  // KVTIER_REMOTE_REDIS_KEY_SLOT_H_
