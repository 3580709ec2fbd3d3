// SPDX-License-Identifier: Apache-2.0
// Per-connection sequence numbers, one counter per NCCL tag. NCCL matches sends to receives in posting order;
// tags only choose the buffer inside a grouped receive. Giving the k-th send with tag t and the k-th receive
// buffer with tag t the same sequence number reproduces exactly that, without any control message.
// Fixed capacity, no allocation after construction: the data path uses it.
#pragma once

#include <array>
#include <cstdint>

namespace weft {

class TagSequence {
 public:
  static constexpr int kCapacity = 256;  // distinct NCCL tags one connection may carry (PXN: one per remote rank)

  // Next sequence number for `tag` plus `ahead` (not consumed). Returns false when the table is full.
  bool peek(int tag, uint32_t ahead, uint32_t* seq) {
    Slot* s = slot(tag);
    if (s == nullptr) return false;
    *seq = static_cast<uint32_t>(s->next + ahead);
    return true;
  }
  // The same as a count that never wraps (how many messages of the tag came before this one).
  bool peek(int tag, uint32_t ahead, uint64_t* count) {
    Slot* s = slot(tag);
    if (s == nullptr) return false;
    *count = s->next + ahead;
    return true;
  }
  // The highest next count over every tag seen (0 when none): a count no tag has reached yet is at least this.
  uint64_t maxNext() const {
    uint64_t m = 0;
    for (const Slot& s : slots_) m = s.used && s.next > m ? s.next : m;
    return m;
  }
  void consume(int tag) {
    Slot* s = slot(tag);
    if (s != nullptr) ++s->next;
  }

 private:
  struct Slot {
    int32_t tag;
    uint64_t next;
    bool used;
  };
  Slot* slot(int tag) {
    uint32_t h = static_cast<uint32_t>(tag) * 2654435761u;
    for (int i = 0; i < kCapacity; ++i) {
      Slot& s = slots_[(h + i) % kCapacity];
      if (!s.used) {
        s.used = true;
        s.tag = tag;
        s.next = 0;
        return &s;
      }
      if (s.tag == tag) return &s;
    }
    return nullptr;
  }
  std::array<Slot, kCapacity> slots_{};
};

}  // namespace weft
