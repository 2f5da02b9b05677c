// Appends little-endian integers and typed, length-prefixed fields (tag byte, u32 LE length,
// bytes) to a byte buffer. The encoding behind block keys and namespace digests; its layout is
// documented in docs/formats.md and pinned by golden-vector tests.
#ifndef KVTIER_INTERNAL_BYTE_WRITER_H_
#define KVTIER_INTERNAL_BYTE_WRITER_H_

#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace kvtier::internal {

// Fixed-width stores and loads at a raw pointer, independent of the host's byte order.
inline void StoreU32Le(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void StoreU64Be(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (56 - 8 * i));
}
inline uint64_t LoadU64Be(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>* out) : out_(out) {}

  void U8(uint8_t v) { out_->push_back(v); }
  void U32(uint32_t v) { LittleEndian(v, 4); }
  void U64(uint64_t v) { LittleEndian(v, 8); }
  void Bytes(const void* data, size_t size) {
    const auto* p = static_cast<const uint8_t*>(data);
    out_->insert(out_->end(), p, p + size);
  }
  // Tag, u32 length, then the bytes.
  void Field(uint8_t tag, std::string_view bytes) {
    U8(tag);
    U32(static_cast<uint32_t>(bytes.size()));
    Bytes(bytes.data(), bytes.size());
  }
  void FieldU64(uint8_t tag, uint64_t v) {
    U8(tag);
    U32(8);
    U64(v);
  }

 private:
  void LittleEndian(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_->push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t>* out_;
};

}  // namespace kvtier::internal

#endif  // KVTIER_INTERNAL_BYTE_WRITER_H_
