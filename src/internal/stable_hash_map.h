// StableHashMap: a hash map whose elements never move until erased, at 4 bytes of table per
// element (plus a 4-byte link inside each element's slot) instead of a node map's 8-byte slot,
// 16-byte heap header and power-of-two slack.
//
// Why: the cache keeps one record per block for up to millions of blocks, and its parts hand
// each other element pointers (so the map must keep addresses stable). A node map costs
// 8 B/slot of table at up to 2x slack plus a malloc chunk per element (16 B of header and
// rounding); here elements live in chunks of kChunk slots, chained through a uint32 index, with
// a bucket array of uint32 heads at load factor <= 1.
//
// Contract:
//   * value_type is std::pair<const Key, Value>; references and pointers to elements stay valid
//     until that element is erased (insertions and growth never move elements).
//   * Iterators are invalidated by any insertion or erasure (except erase's own return value).
//     Iteration order is slot order, not insertion order.
//   * handle(it): a uint32 naming an element, valid until that element is erased (after which
//     the map may reuse it for another element).
//   * Capacity: at most 2^31 - 1 elements (emplacing past it aborts: a programming error at
//     64 GiB of records, not a runtime condition).
//   * Not thread-safe: the owner serialises access (the cache holds its lock).
#ifndef KVTIER_INTERNAL_STABLE_HASH_MAP_H_
#define KVTIER_INTERNAL_STABLE_HASH_MAP_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"

namespace kvtier::internal {

template <typename Key, typename Value, typename Hash = absl::Hash<Key>>
class StableHashMap {
 public:
  using key_type = Key;
  using mapped_type = Value;
  using value_type = std::pair<const Key, Value>;

 private:
  static constexpr uint32_t kNil = 0x7FFFFFFFu;      // no slot (ends a chain or the free list)
  static constexpr uint32_t kFreeBit = 0x80000000u;  // in Slot::next: the slot holds nothing
  static constexpr uint32_t kChunk = 4096;           // slots per chunk (a power of two)

  struct Slot {
    union {
      value_type kv;
    };
    // Live: the next slot in its bucket's chain (kNil ends it). Free: kFreeBit | the next free
    // slot (kNil ends the free list).
    uint32_t next;
    Slot() {}
    ~Slot() {}
  };

  template <bool kConst>
  class Iter {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = StableHashMap::value_type;
    using difference_type = std::ptrdiff_t;
    using reference = std::conditional_t<kConst, const value_type&, value_type&>;
    using pointer = std::conditional_t<kConst, const value_type*, value_type*>;
    using Map = std::conditional_t<kConst, const StableHashMap, StableHashMap>;

    Iter() = default;
    Iter(Map* map, uint32_t index) : map_(map), index_(index) { SkipFree(); }
    // iterator -> const_iterator.
    template <bool kOther, typename = std::enable_if_t<kConst && !kOther>>
    Iter(const Iter<kOther>& other) : map_(other.map_), index_(other.index_) {}  // NOLINT

    reference operator*() const { return map_->SlotAt(index_).kv; }
    pointer operator->() const { return &map_->SlotAt(index_).kv; }
    Iter& operator++() {
      ++index_;
      SkipFree();
      return *this;
    }
    Iter operator++(int) {
      Iter old = *this;
      ++*this;
      return old;
    }
    friend bool operator==(const Iter& a, const Iter& b) { return a.index_ == b.index_; }

   private:
    friend class StableHashMap;
    template <bool>
    friend class Iter;
    void SkipFree() {
      while (index_ < map_->used_ && (map_->SlotAt(index_).next & kFreeBit) != 0) ++index_;
    }
    Map* map_ = nullptr;
    uint32_t index_ = 0;
  };

 public:
  using iterator = Iter<false>;
  using const_iterator = Iter<true>;

  StableHashMap() = default;
  StableHashMap(const StableHashMap&) = delete;
  StableHashMap& operator=(const StableHashMap&) = delete;
  ~StableHashMap() { clear(); }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  iterator begin() { return iterator(this, 0); }
  iterator end() { return iterator(this, used_); }
  const_iterator begin() const { return const_iterator(this, 0); }
  const_iterator end() const { return const_iterator(this, used_); }

  iterator find(const Key& key) { return iterator(this, FindIndex(key)); }
  const_iterator find(const Key& key) const { return const_iterator(this, FindIndex(key)); }
  bool contains(const Key& key) const { return FindIndex(key) != used_; }

  // Inserts (key, Value(args...)) unless key is present; returns the element and whether it was
  // inserted. Never moves other elements.
  template <typename... Args>
  std::pair<iterator, bool> try_emplace(const Key& key, Args&&... args) {
    if (uint32_t i = FindIndex(key); i != used_) return {iterator(this, i), false};
    if (size_ + 1 > buckets_.size()) Rehash(buckets_.empty() ? 16 : buckets_.size() * 2);
    const uint32_t i = AllocateSlot();
    Slot& s = SlotAt(i);
    ::new (&s.kv) value_type(std::piecewise_construct, std::forward_as_tuple(key),
                             std::forward_as_tuple(std::forward<Args>(args)...));
    uint32_t& head = buckets_[Bucket(key)];
    s.next = head;
    head = i;
    ++size_;
    return {iterator(this, i), true};
  }
  Value& operator[](const Key& key) { return try_emplace(key).first->second; }

  // A 4-byte handle for the element at `it` (not end()): valid, and naming that element, until
  // it is erased; at_handle(h) gives the element back (h must be valid).
  static uint32_t handle(const_iterator it) { return it.index_; }
  value_type& at_handle(uint32_t h) { return SlotAt(h).kv; }
  const value_type& at_handle(uint32_t h) const { return SlotAt(h).kv; }

  // Erases the element at `it` (which must be valid and not end()); returns the next element.
  iterator erase(iterator it) {
    const uint32_t i = it.index_;
    Unlink(i);
    ++it;
    return it;
  }
  // Erases the element of `key`; returns how many were erased (0 or 1).
  size_t erase(const Key& key) {
    const uint32_t i = FindIndex(key);
    if (i == used_) return 0;
    Unlink(i);
    return 1;
  }

  void clear() {
    for (uint32_t i = 0; i < used_; ++i) {
      Slot& s = SlotAt(i);
      if ((s.next & kFreeBit) == 0) s.kv.~value_type();
    }
    chunks_.clear();
    buckets_.clear();
    used_ = 0;
    size_ = 0;
    free_ = kNil;
  }

  // Heap bytes the map holds (chunks and buckets), for memory accounting.
  size_t heap_bytes() const {
    return chunks_.size() * kChunk * sizeof(Slot) + buckets_.capacity() * sizeof(uint32_t) +
           chunks_.capacity() * sizeof(chunks_[0]);
  }

 private:
  Slot& SlotAt(uint32_t i) { return chunks_[i / kChunk][i % kChunk]; }
  const Slot& SlotAt(uint32_t i) const { return chunks_[i / kChunk][i % kChunk]; }
  size_t Bucket(const Key& key) const { return Hash{}(key) & (buckets_.size() - 1); }

  // The slot index of `key`, or used_ where absent.
  uint32_t FindIndex(const Key& key) const {
    if (buckets_.empty()) return used_;
    for (uint32_t i = buckets_[Bucket(key)]; i != kNil; i = SlotAt(i).next) {
      if (SlotAt(i).kv.first == key) return i;
    }
    return used_;
  }

  uint32_t AllocateSlot() {
    if (free_ != kNil) {
      const uint32_t i = free_;
      free_ = SlotAt(i).next & ~kFreeBit;
      return i;
    }
    if (used_ >= kNil) std::abort();  // 2^31 - 1 elements: see the contract
    if (used_ % kChunk == 0) chunks_.push_back(std::make_unique<Slot[]>(kChunk));
    return used_++;
  }

  // Unchains slot i, destroys its element and puts it on the free list.
  void Unlink(uint32_t i) {
    Slot& s = SlotAt(i);
    uint32_t* link = &buckets_[Bucket(s.kv.first)];
    while (*link != i) link = &SlotAt(*link).next;
    *link = s.next;
    s.kv.~value_type();
    s.next = kFreeBit | free_;
    free_ = i;
    --size_;
  }

  void Rehash(size_t buckets) {
    buckets_.assign(buckets, kNil);
    buckets_.shrink_to_fit();
    for (uint32_t i = 0; i < used_; ++i) {
      Slot& s = SlotAt(i);
      if ((s.next & kFreeBit) != 0) continue;
      uint32_t& head = buckets_[Bucket(s.kv.first)];
      s.next = head;
      head = i;
    }
  }

  std::vector<std::unique_ptr<Slot[]>> chunks_;
  std::vector<uint32_t> buckets_;  // chain heads by hash & (size - 1); size a power of two
  uint32_t used_ = 0;              // slots ever handed out (free ones included)
  uint32_t free_ = kNil;           // head of the free slots' list
  size_t size_ = 0;
};

}  // namespace kvtier::internal

#endif  // KVTIER_INTERNAL_STABLE_HASH_MAP_H_
