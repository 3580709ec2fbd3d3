// SPDX-License-Identifier: Apache-2.0
#include "weft/transport/mr_cache.h"

#include <memory>

#include "weft/common/log.h"

namespace weft {

MrCache::~MrCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [base, e] : entries_) {
    registrar_->deregisterRange(e);
    delete e;
  }
}

Status MrCache::reg(void* data, size_t size, int type, MemHandle** out) {
  auto addr = reinterpret_cast<uintptr_t>(data);
  auto mh = std::make_unique<MemHandle>();
  mh->addr = addr;
  mh->len = size;
  mh->type = type;
  std::lock_guard<std::mutex> lock(mutex_);
  // Any cached entry of the same type that covers [addr, addr+size) serves. Entries are few (one per
  // distinct buffer), so scanning those that start at or before addr is cheap enough for a service-thread call.
  auto it = entries_.upper_bound(addr);
  while (it != entries_.begin()) {
    --it;
    MrEntry* e = it->second;
    if (e->type == type && e->base <= addr && addr + size <= e->base + e->len) {
      ++e->refs;
      ++stats_.hits;
      ++stats_.handles;
      mh->entry = e;
      *out = mh.release();
      return Status::kOk;
    }
  }
  // Register whole pages so neighbouring sub-ranges of the same allocation hit this entry later.
  uintptr_t base = addr & ~(uintptr_t)(page_ - 1);
  uintptr_t end = (addr + size + page_ - 1) & ~(uintptr_t)(page_ - 1);
  if (end == base) end = base + page_;  // 0-byte registration still gets a valid entry
  auto e = std::make_unique<MrEntry>();
  e->base = base;
  e->len = end - base;
  e->type = type;
  e->refs = 1;
  Status st = registrar_->registerRange(base, e->len, type, -1, 0, e.get());
  if (st != Status::kOk) return st;
  ++stats_.misses;
  ++stats_.live;
  ++stats_.handles;
  mh->entry = e.get();
  entries_.emplace(base, e.release());
  *out = mh.release();
  return Status::kOk;
}

Status MrCache::regDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd, MemHandle** out) {
  // The fd is closed by NCCL right after this call, so the registration cannot be shared or looked up later.
  auto mh = std::make_unique<MemHandle>();
  auto e = std::make_unique<MrEntry>();
  e->base = reinterpret_cast<uintptr_t>(data);
  e->len = size;
  e->type = type;
  e->refs = 1;
  Status st = registrar_->registerRange(e->base, size, type, fd, offset, e.get());
  if (st != Status::kOk) return st;
  mh->addr = e->base;
  mh->len = size;
  mh->type = type;
  mh->cached = false;
  mh->entry = e.release();
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.handles;
  *out = mh.release();
  return Status::kOk;
}

Status MrCache::dereg(MemHandle* mh) {
  if (mh == nullptr || mh->magic_ != kMrMagic) {
    WEFT_WARN("deregMr: {} is not a live weft memory handle (already deregistered, or not from regMr)",
              static_cast<void*>(mh));
    return Status::kInternal;
  }
  std::unique_ptr<MemHandle> owned(mh);
  MrEntry* e = mh->entry;
  std::lock_guard<std::mutex> lock(mutex_);
  --stats_.handles;
  if (!mh->cached) {
    registrar_->deregisterRange(e);
    delete e;
    return Status::kOk;
  }
  if (--e->refs > 0) return Status::kOk;
  // Last handle gone: release the registration. Keeping it would pin memory the application may free and
  // reuse for something else (a stale translation is worse than a re-registration).
  for (auto it = entries_.find(e->base); it != entries_.end() && it->first == e->base; ++it) {
    if (it->second == e) {
      entries_.erase(it);
      break;
    }
  }
  registrar_->deregisterRange(e);
  delete e;
  --stats_.live;
  return Status::kOk;
}

MrCache::Stats MrCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

Status checkMemHandle(const MemHandle* mh, const void* data, size_t size, const char* op, bool nullOk,
                      const std::string& device) {
  if (mh == nullptr) {
    if (nullOk) return Status::kOk;
    WEFT_WARN("{} on {}: NULL memory handle for {} B, but this device needs registered buffers", op, device, size);
    return Status::kInternal;
  }
  if (mh->magic_ != kMrMagic) {
    WEFT_WARN("{} on {}: {} is not a live weft memory handle", op, device, static_cast<const void*>(mh));
    return Status::kInternal;
  }
  const auto a = reinterpret_cast<uintptr_t>(data);
  if (data != nullptr && size > 0 && (a < mh->addr || a + size > mh->addr + mh->len)) {
    WEFT_WARN("{} on {}: buffer [{:#x}, +{} B) lies outside its memory handle's registration [{:#x}, +{} B)", op,
              device, a, size, mh->addr, mh->len);
    return Status::kInvalidUsage;
  }
  return Status::kOk;
}

}  // namespace weft
