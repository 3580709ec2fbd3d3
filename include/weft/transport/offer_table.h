// The sender's view of the receiver's buffer offers (rdma protocol): a fixed-capacity hash table keyed by the
// 64-bit data tag (NCCL tag and per-tag sequence number). An entry is either an offer waiting for its isend, or
// a marker saying the message already left eagerly, so that its offer, when it comes, is dropped.
// Open addressing with linear probing and backward-shift deletion: no tombstones, no allocation after
// construction, O(1) expected on the data path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace weft {

template <typename Value, size_t kCapacity = 2048>
class OfferTable {
  static_assert((kCapacity & (kCapacity - 1)) == 0, "capacity must be a power of two");

 public:
  enum class Kind : uint8_t { kEmpty = 0, kOffer, kEagerSent };

  OfferTable() : slots_(new Slot[kCapacity]) {}

  // Offer for `key`, or nullptr.
  Value* findOffer(uint64_t key) {
    Slot* s = find(key);
    return s != nullptr && s->kind == Kind::kOffer ? &s->value : nullptr;
  }

  // An offer arrived. Returns false if the table is full (a protocol violation: the peer offered more than
  // NCCL can have outstanding) or the same key was offered twice.
  bool addOffer(uint64_t key, const Value& v, bool* droppedEager) {
    *droppedEager = false;
    if (Slot* s = find(key); s != nullptr) {
      if (s->kind != Kind::kEagerSent) return false;
      erase(s);  // the message went eagerly before its offer arrived: nothing to keep
      --eagerMarks_;
      *droppedEager = true;
      return true;
    }
    Slot* s = insertSlot(key);
    if (s == nullptr) return false;
    s->kind = Kind::kOffer;
    s->value = v;
    return true;
  }

  // The message with `key` left eagerly: consumes its offer if it is already here, else leaves a marker.
  // Returns false (nothing changed) when no marker can be stored.
  bool markEager(uint64_t key) {
    if (Slot* s = find(key); s != nullptr) {
      if (s->kind == Kind::kOffer) {
        erase(s);
        return true;
      }
      return false;  // already marked: the same message twice cannot happen
    }
    if (eagerMarks_ >= kCapacity / 2) return false;
    Slot* s = insertSlot(key);
    if (s == nullptr) return false;
    s->kind = Kind::kEagerSent;
    ++eagerMarks_;
    return true;
  }

  // True when markEager would have room (the sender back-pressures otherwise).
  bool eagerRoom() const { return eagerMarks_ < kCapacity / 2 && used_ < kCapacity - 1; }

  void eraseOffer(uint64_t key) {
    if (Slot* s = find(key); s != nullptr && s->kind == Kind::kOffer) erase(s);
  }

  size_t size() const { return used_; }
  size_t eagerMarks() const { return eagerMarks_; }

 private:
  struct Slot {
    uint64_t key = 0;
    Kind kind = Kind::kEmpty;
    Value value{};
  };

  static size_t home(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return static_cast<size_t>(key) & (kCapacity - 1);
  }

  Slot* find(uint64_t key) {
    for (size_t i = home(key), n = 0; n < kCapacity; i = (i + 1) & (kCapacity - 1), ++n) {
      Slot& s = slots_[i];
      if (s.kind == Kind::kEmpty) return nullptr;
      if (s.key == key) return &s;
    }
    return nullptr;
  }

  Slot* insertSlot(uint64_t key) {
    if (used_ >= kCapacity - 1) return nullptr;  // keep one hole so probes end
    for (size_t i = home(key);; i = (i + 1) & (kCapacity - 1)) {
      Slot& s = slots_[i];
      if (s.kind == Kind::kEmpty) {
        s.key = key;
        ++used_;
        return &s;
      }
    }
  }

  void erase(Slot* s) {
    size_t hole = static_cast<size_t>(s - slots_.get());
    for (size_t i = (hole + 1) & (kCapacity - 1);; i = (i + 1) & (kCapacity - 1)) {
      Slot& next = slots_[i];
      if (next.kind == Kind::kEmpty) break;
      size_t h = home(next.key);
      // `next` may move into the hole if its home is not in the cyclic range (hole, i].
      bool stays = hole <= i ? (hole < h && h <= i) : (hole < h || h <= i);
      if (!stays) {
        slots_[hole] = next;
        hole = i;
      }
    }
    slots_[hole].kind = Kind::kEmpty;
    --used_;
  }

  std::unique_ptr<Slot[]> slots_;
  size_t used_ = 0;
  size_t eagerMarks_ = 0;
};

}  // namespace weft
