// SPDX-License-Identifier: Apache-2.0
// The sender's view of the receiver's buffer offers (rdma protocol): a fixed-capacity hash table keyed by the
// 64-bit data tag (NCCL tag and per-tag sequence number). An entry is either an offer waiting for its isend, or
// a marker saying the message already left eagerly, so that its offer, when it comes, is dropped.
// Open addressing with linear probing and backward-shift deletion: no tombstones, O(1) expected on the data path.
// The table starts at kInitial slots and doubles when half full, up to kCapacity: a connection pays for the
// offers it actually has outstanding (32 slots, 3.3 KiB with fabric's 104-byte entries, for a quiet one; NCCL's
// 32 requests x 8 buffers reach 512-1,024), and at most log2(kCapacity / kInitial) allocations in its life.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace weft {

template <typename Value, size_t kCapacity = 2048, size_t kInitial = (kCapacity < 32 ? kCapacity : 32)>
class OfferTable {
  static_assert((kCapacity & (kCapacity - 1)) == 0, "capacity must be a power of two");
  static_assert((kInitial & (kInitial - 1)) == 0 && kInitial >= 2 && kInitial <= kCapacity,
                "the initial size must be a power of two no larger than the capacity");

 public:
  enum class Kind : uint8_t { kEmpty = 0, kOffer, kEagerSent };

  OfferTable() : slots_(new Slot[kInitial]), mask_(kInitial - 1) {}

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
  bool eagerRoom() const { return eagerMarks_ < kCapacity / 2 && used_ < kCapacity - 1; }  // grows to make room

  // Drops the marker of a message that left eagerly, if there is one (its offer can no longer come: rail
  // failover offered the buffer again instead). True if there was one.
  bool dropEagerMark(uint64_t key) {
    Slot* s = find(key);
    if (s == nullptr || s->kind != Kind::kEagerSent) return false;
    erase(s);
    --eagerMarks_;
    return true;
  }

  void eraseOffer(uint64_t key) {
    if (Slot* s = find(key); s != nullptr && s->kind == Kind::kOffer) erase(s);
  }

  size_t size() const { return used_; }
  size_t eagerMarks() const { return eagerMarks_; }
  size_t slots() const { return mask_ + 1; }  // allocated now (grows to kCapacity)

 private:
  struct Slot {
    uint64_t key = 0;
    Kind kind = Kind::kEmpty;
    Value value{};
  };

  size_t home(uint64_t key) const {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return static_cast<size_t>(key) & mask_;
  }

  Slot* find(uint64_t key) {
    for (size_t i = home(key), n = 0; n <= mask_; i = (i + 1) & mask_, ++n) {
      Slot& s = slots_[i];
      if (s.kind == Kind::kEmpty) return nullptr;
      if (s.key == key) return &s;
    }
    return nullptr;
  }

  // Doubles the table (rehashing every entry) when it is half full and may grow; an allocation that fails leaves
  // it as it is, to fill up to its last hole.
  void maybeGrow() {
    if (2 * (used_ + 1) <= mask_ + 1 || mask_ + 1 >= kCapacity) return;
    const size_t n = 2 * (mask_ + 1);
    std::unique_ptr<Slot[]> bigger(new (std::nothrow) Slot[n]);
    if (bigger == nullptr) return;
    std::unique_ptr<Slot[]> old = std::move(slots_);
    const size_t oldCount = mask_ + 1;
    slots_ = std::move(bigger);
    mask_ = n - 1;
    for (size_t j = 0; j < oldCount; ++j) {
      if (old[j].kind == Kind::kEmpty) continue;
      size_t i = home(old[j].key);
      while (slots_[i].kind != Kind::kEmpty) i = (i + 1) & mask_;
      slots_[i] = old[j];
    }
  }

  Slot* insertSlot(uint64_t key) {
    maybeGrow();
    if (used_ >= mask_) return nullptr;  // keep one hole so probes end
    for (size_t i = home(key);; i = (i + 1) & mask_) {
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
    for (size_t i = (hole + 1) & mask_;; i = (i + 1) & mask_) {
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
  size_t mask_;  // slots allocated - 1
  size_t used_ = 0;
  size_t eagerMarks_ = 0;
};

}  // namespace weft
