// SPDX-License-Identifier: Apache-2.0
// The mock CUDA driver: see mock_cuda.h. Its own declarations of the few driver types and values it answers
// (checked against cuda.h by the values NVIDIA documents; no CUDA header is needed to build it).
#include "mock_cuda.h"

#include <fcntl.h>
#include <linux/udmabuf.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <mutex>

namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;
using CUdevice = int;
struct MockContext {
  int device;
};
using CUcontext = MockContext*;

constexpr CUresult kSuccess = 0;
constexpr CUresult kInvalidValue = 1;
constexpr CUresult kOutOfMemory = 2;
constexpr CUresult kNotInitialized = 3;
constexpr CUresult kInvalidDevice = 101;
constexpr CUresult kNotSupported = 801;

constexpr int kAttrContext = 1;
constexpr int kAttrMemoryType = 2;
constexpr int kAttrDevicePointer = 3;
constexpr int kAttrDeviceOrdinal = 9;
constexpr int kAttrRangeStart = 11;
constexpr int kAttrRangeSize = 12;
constexpr int kAttrSyncMemops = 6;
constexpr int kAttrIsManaged = 8;
constexpr unsigned kMemoryTypeDevice = 2;
constexpr int kDevAttrDmaBufSupported = 124;
constexpr int kRangeHandleDmaBuf = 1;

MockContext gContext{0};
std::atomic<bool> gInit{false};

// Allocations live in a fixed table whose base/size words are read without a lock (the fault handler reads
// them); writers hold the mutex. base 0: a free slot.
constexpr int kMaxAllocations = 8192;
struct Allocation {
  std::atomic<uintptr_t> base{0};
  std::atomic<size_t> size{0};
  uint8_t* alias = nullptr;  // the mock's own read-write mapping of the same pages
  size_t mapped = 0;
  int memfd = -1;
  int windows = 0;
};
Allocation gAlloc[kMaxAllocations];
std::mutex gMutex;
std::atomic<int> gUsed{0};  // slots [0, gUsed) may be in use
std::atomic<uint64_t> gLive{0}, gDmabufs{0}, gFlushes{0}, gWindows{0}, gRuntimeCopies{0}, gSynchronizes{0};
const size_t gPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// The allocation holding [p, p + len), or nullptr. Caller holds gMutex or only reads base/size.
Allocation* find(uintptr_t p, size_t len) {
  const int used = gUsed.load(std::memory_order_acquire);
  for (int i = 0; i < used; ++i) {
    Allocation& a = gAlloc[i];
    uintptr_t b = a.base.load(std::memory_order_acquire);
    if (b == 0) continue;
    size_t s = a.size.load(std::memory_order_acquire);
    if (p >= b && p - b <= s && len <= s - (p - b)) return &gAlloc[i];
  }
  return nullptr;
}

size_t pageRound(size_t n) { return (n + gPage - 1) / gPage * gPage; }

// The errors the mock returns, with the driver's names and texts.
struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {kSuccess, "CUDA_SUCCESS", "no error"},
    {kInvalidValue, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {kOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {kNotInitialized, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {kInvalidDevice, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {kNotSupported, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
};
const ErrorText* errorText(CUresult r) {
  for (const ErrorText& e : kErrors)
    if (e.code == r) return &e;
  return nullptr;
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned flags) {
  if (flags != 0) return kInvalidValue;
  gInit = true;
  return kSuccess;
}

CUresult cuDriverGetVersion(int* v) {
  if (v == nullptr) return kInvalidValue;
  *v = 13000;
  return kSuccess;
}

CUresult cuDeviceGetCount(int* n) {
  if (!gInit) return kNotInitialized;
  if (n == nullptr) return kInvalidValue;
  *n = 1;
  return kSuccess;
}

CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (!gInit) return kNotInitialized;
  if (d == nullptr) return kInvalidValue;
  if (ordinal != 0) return kInvalidDevice;
  *d = 0;
  return kSuccess;
}

CUresult cuDeviceGetAttribute(int* value, int attr, CUdevice d) {
  if (!gInit) return kNotInitialized;
  if (value == nullptr) return kInvalidValue;
  if (d != 0) return kInvalidDevice;
  *value = 0;
  if (attr == kDevAttrDmaBufSupported) *value = access("/dev/udmabuf", R_OK | W_OK) == 0 ? 1 : 0;
  return kSuccess;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice d) {
  if (!gInit) return kNotInitialized;
  if (ctx == nullptr) return kInvalidValue;
  if (d != 0) return kInvalidDevice;
  *ctx = &gContext;
  return kSuccess;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return d == 0 ? kSuccess : kInvalidDevice; }

// The one device's PCI bus id, as the driver writes it (8-digit domain): MOCK_CUDA_PCI_BUS_ID (a GPU of a topology
// fixture, for tests of locality), else 0000:01:00.0.
CUresult cuDeviceGetPCIBusId(char* out, int len, CUdevice d) {
  if (!gInit) return kNotInitialized;
  if (out == nullptr || len <= 0) return kInvalidValue;
  if (d != 0) return kInvalidDevice;
  const char* set = getenv("MOCK_CUDA_PCI_BUS_ID");
  std::string bus = set != nullptr && *set != '\0' ? set : "0000:01:00.0";
  if (bus.size() == 12) bus = "0000" + bus;
  if (static_cast<int>(bus.size()) >= len) return kInvalidValue;
  std::memcpy(out, bus.c_str(), bus.size() + 1);
  return kSuccess;
}
// The current context's device: the mock's one context is device 0's, current on every thread once cuInit ran.
CUresult cuCtxGetDevice(CUdevice* d) {
  if (!gInit) return kNotInitialized;
  if (d == nullptr) return kInvalidValue;
  *d = 0;
  return kSuccess;
}
CUresult cuCtxSetCurrent(CUcontext) { return gInit ? kSuccess : kNotInitialized; }
CUresult cuCtxGetCurrent(CUcontext* ctx) {
  if (ctx == nullptr) return kInvalidValue;
  *ctx = &gContext;
  return kSuccess;
}

// Every copy of the mock is complete when it returns: a synchronize has nothing to wait for, and is counted.
CUresult cuCtxSynchronize() {
  if (!gInit) return kNotInitialized;
  ++gSynchronizes;
  return kSuccess;
}

CUresult cuGetErrorString(CUresult r, const char** s) {
  if (s == nullptr) return kInvalidValue;
  const ErrorText* e = errorText(r);
  *s = e != nullptr ? e->text : "unknown error";
  return e != nullptr ? kSuccess : kInvalidValue;
}

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t size) {
  if (!gInit) return kNotInitialized;
  if (dptr == nullptr || size == 0) return kInvalidValue;
  const size_t mapped = pageRound(size);
  int fd = memfd_create("weft-mock-cuda", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return kOutOfMemory;
  if (ftruncate(fd, static_cast<off_t>(mapped)) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    close(fd);
    return kOutOfMemory;
  }
  void* dev = mmap(nullptr, mapped, PROT_NONE, MAP_SHARED, fd, 0);
  void* alias = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (dev == MAP_FAILED || alias == MAP_FAILED) {
    if (dev != MAP_FAILED) munmap(dev, mapped);
    if (alias != MAP_FAILED) munmap(alias, mapped);
    close(fd);
    return kOutOfMemory;
  }
  std::lock_guard<std::mutex> lock(gMutex);
  for (int i = 0; i < kMaxAllocations; ++i) {
    Allocation& a = gAlloc[i];
    if (a.base.load() != 0) continue;
    if (i >= gUsed.load()) gUsed.store(i + 1, std::memory_order_release);
    a.alias = static_cast<uint8_t*>(alias);
    a.mapped = mapped;
    a.memfd = fd;
    a.windows = 0;
    a.size.store(size, std::memory_order_release);
    a.base.store(reinterpret_cast<uintptr_t>(dev), std::memory_order_release);
    ++gLive;
    *dptr = reinterpret_cast<CUdeviceptr>(dev);
    return kSuccess;
  }
  munmap(dev, mapped);
  munmap(alias, mapped);
  close(fd);
  return kOutOfMemory;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  std::lock_guard<std::mutex> lock(gMutex);
  Allocation* a = find(static_cast<uintptr_t>(dptr), 0);
  if (a == nullptr || a->base.load() != static_cast<uintptr_t>(dptr)) return kInvalidValue;
  void* dev = reinterpret_cast<void*>(a->base.load());
  a->base.store(0, std::memory_order_release);
  a->size.store(0, std::memory_order_release);
  munmap(dev, a->mapped);
  munmap(a->alias, a->mapped);
  close(a->memfd);
  a->alias = nullptr;
  a->memfd = -1;
  --gLive;
  return kSuccess;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  std::lock_guard<std::mutex> lock(gMutex);
  Allocation* a = find(static_cast<uintptr_t>(dst), n);
  if (a == nullptr || (src == nullptr && n > 0)) return kInvalidValue;
  std::memcpy(a->alias + (static_cast<uintptr_t>(dst) - a->base.load()), src, n);
  return kSuccess;
}

CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  std::lock_guard<std::mutex> lock(gMutex);
  Allocation* a = find(static_cast<uintptr_t>(src), n);
  if (a == nullptr || (dst == nullptr && n > 0)) return kInvalidValue;
  std::memcpy(dst, a->alias + (static_cast<uintptr_t>(src) - a->base.load()), n);
  return kSuccess;
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
  std::lock_guard<std::mutex> lock(gMutex);
  Allocation* a = find(static_cast<uintptr_t>(dst), n);
  if (a == nullptr) return kInvalidValue;
  std::memset(a->alias + (static_cast<uintptr_t>(dst) - a->base.load()), v, n);
  return kSuccess;
}

CUresult cuPointerGetAttribute(void* data, int attr, CUdeviceptr ptr) {
  if (!gInit) return kNotInitialized;
  if (data == nullptr) return kInvalidValue;
  std::lock_guard<std::mutex> lock(gMutex);
  Allocation* a = find(static_cast<uintptr_t>(ptr), 0);
  if (a == nullptr) return kInvalidValue;  // host memory the driver does not know: what the real driver says
  switch (attr) {
    case kAttrContext: *static_cast<CUcontext*>(data) = &gContext; return kSuccess;
    case kAttrMemoryType: *static_cast<unsigned*>(data) = kMemoryTypeDevice; return kSuccess;
    case kAttrDevicePointer: *static_cast<CUdeviceptr*>(data) = ptr; return kSuccess;
    case kAttrDeviceOrdinal: *static_cast<int*>(data) = 0; return kSuccess;
    case kAttrRangeStart: *static_cast<CUdeviceptr*>(data) = a->base.load(); return kSuccess;
    case kAttrRangeSize: *static_cast<size_t*>(data) = a->size.load(); return kSuccess;
    default: return kInvalidValue;
  }
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr ptr) {
  std::lock_guard<std::mutex> lock(gMutex);
  Allocation* a = find(static_cast<uintptr_t>(ptr), 0);
  if (a == nullptr) return kInvalidValue;
  if (base != nullptr) *base = a->base.load();
  if (size != nullptr) *size = a->size.load();
  return kSuccess;
}

// As the driver: the range must be page aligned and inside one allocation; the fd is the caller's to close.
CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr ptr, size_t size, int type, unsigned long long flags) {
  if (handle == nullptr || type != kRangeHandleDmaBuf || flags != 0) return kInvalidValue;
  if (static_cast<uintptr_t>(ptr) % gPage != 0 || size % gPage != 0 || size == 0) return kInvalidValue;
  std::lock_guard<std::mutex> lock(gMutex);
  Allocation* a = find(static_cast<uintptr_t>(ptr), 0);
  if (a == nullptr || static_cast<uintptr_t>(ptr) - a->base.load() + size > a->mapped) return kInvalidValue;
  int dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
  if (dev < 0) return kNotSupported;
  udmabuf_create req{};
  req.memfd = static_cast<uint32_t>(a->memfd);
  req.flags = UDMABUF_FLAGS_CLOEXEC;
  req.offset = static_cast<uintptr_t>(ptr) - a->base.load();
  req.size = size;
  int fd = ioctl(dev, UDMABUF_CREATE, &req);
  close(dev);
  if (fd < 0) return kNotSupported;
  *static_cast<int*>(handle) = fd;
  ++gDmabufs;
  return kSuccess;
}

CUresult cuFlushGPUDirectRDMAWrites(int target, int scope) {
  (void)target;
  (void)scope;
  if (!gInit) return kNotInitialized;
  ++gFlushes;
  return kSuccess;
}

// What libfabric's CUDA memory support (src/hmem_cuda.c, 2.x) asks of the driver beyond the above.
CUresult cuGetErrorName(CUresult r, const char** s) {
  if (s == nullptr) return kInvalidValue;
  const ErrorText* e = errorText(r);
  *s = e != nullptr ? e->name : "CUDA_ERROR_UNKNOWN";
  return e != nullptr ? kSuccess : kInvalidValue;
}

// Unlike cuPointerGetAttribute, not an error for memory the driver does not know: every attribute reads as 0.
CUresult cuPointerGetAttributes(unsigned n, int* attrs, void** data, CUdeviceptr ptr) {
  if (!gInit) return kNotInitialized;
  if (n > 0 && (attrs == nullptr || data == nullptr)) return kInvalidValue;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(gMutex);
    known = find(static_cast<uintptr_t>(ptr), 0) != nullptr;
  }
  for (unsigned i = 0; i < n; ++i) {
    if (data[i] == nullptr) continue;
    if (attrs[i] == kAttrIsManaged) {
      *static_cast<unsigned*>(data[i]) = 0;
    } else if (!known) {
      if (attrs[i] == kAttrMemoryType || attrs[i] == kAttrDeviceOrdinal) *static_cast<unsigned*>(data[i]) = 0;
      else if (attrs[i] == kAttrContext) *static_cast<CUcontext*>(data[i]) = nullptr;
      else if (attrs[i] == kAttrDevicePointer || attrs[i] == kAttrRangeStart) *static_cast<CUdeviceptr*>(data[i]) = 0;
      else if (attrs[i] == kAttrRangeSize) *static_cast<size_t*>(data[i]) = 0;
      else return kInvalidValue;
    } else if (CUresult r = cuPointerGetAttribute(data[i], attrs[i], ptr); r != kSuccess) {
      return r;
    }
  }
  return kSuccess;
}

CUresult cuPointerSetAttribute(const void* value, int attr, CUdeviceptr ptr) {
  if (!gInit) return kNotInitialized;
  if (value == nullptr || attr != kAttrSyncMemops) return kInvalidValue;
  std::lock_guard<std::mutex> lock(gMutex);
  return find(static_cast<uintptr_t>(ptr), 0) != nullptr ? kSuccess : kInvalidValue;
}

CUresult cuDeviceCanAccessPeer(int* can, CUdevice d, CUdevice peer) {
  if (!gInit) return kNotInitialized;
  if (can == nullptr) return kInvalidValue;
  if (d != 0 || peer != 0) return kInvalidDevice;  // one device
  *can = 0;
  return kSuccess;
}

CUresult cuMemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr ptr) {
  return cuMemGetAddressRange_v2(base, size, ptr);
}

// The runtime (libcudart.so: the same file under that name, build/mock-cuda/libcudart.so), as far as libfabric uses
// it: one device, memory from cuMemAlloc, copies that read and write device memory through the mock's own mapping.
// Runtime error codes: cudaSuccess 0, cudaErrorInvalidValue 1, cudaErrorMemoryAllocation 2, cudaErrorInvalidDevice
// 101, cudaErrorNotSupported 801.
int cudaGetDeviceCount(int* n) {
  if (n == nullptr) return 1;
  gInit = true;
  *n = 1;
  return 0;
}
int cudaGetDevice(int* d) {
  if (d == nullptr) return 1;
  *d = 0;
  return 0;
}
int cudaSetDevice(int d) {
  gInit = true;
  return d == 0 ? 0 : 101;
}
int cudaMalloc(void** p, size_t size) {
  gInit = true;
  if (p == nullptr) return 1;
  CUdeviceptr d = 0;
  CUresult r = cuMemAlloc_v2(&d, size);
  if (r != kSuccess) return r == kOutOfMemory ? 2 : 1;
  *p = reinterpret_cast<void*>(d);
  return 0;
}
int cudaFree(void* p) { return p == nullptr || cuMemFree_v2(reinterpret_cast<CUdeviceptr>(p)) == kSuccess ? 0 : 1; }
int cudaDeviceSynchronize() { return 0; }
int cudaHostRegister(void*, size_t, unsigned) { return 0; }
int cudaHostUnregister(void*) { return 0; }
// Any direction (cudaMemcpyDefault, as libfabric asks): device memory is reached through its CPU alias, host memory
// directly. A range that starts in an allocation and runs past its end is an error, as on a GPU.
int cudaMemcpy(void* dst, const void* src, size_t n, int /*kind*/) {
  if (n == 0) return 0;
  if (dst == nullptr || src == nullptr) return 1;
  std::lock_guard<std::mutex> lock(gMutex);
  auto place = [](uintptr_t p, size_t len, uint8_t** out) {
    if (Allocation* a = find(p, len)) {
      *out = a->alias + (p - a->base.load());
      return true;
    }
    if (find(p, 0) != nullptr) return false;  // starts in device memory, ends past it
    *out = reinterpret_cast<uint8_t*>(p);
    return true;
  };
  uint8_t* d = nullptr;
  uint8_t* s = nullptr;
  if (!place(reinterpret_cast<uintptr_t>(dst), n, &d) ||
      !place(reinterpret_cast<uintptr_t>(const_cast<void*>(src)), n, &s)) {
    return 1;
  }
  std::memmove(d, s, n);
  ++gRuntimeCopies;
  return 0;
}
const char* cudaGetErrorName(int e) {
  switch (e) {
    case 0: return "cudaSuccess";
    case 1: return "cudaErrorInvalidValue";
    case 2: return "cudaErrorMemoryAllocation";
    case 101: return "cudaErrorInvalidDevice";
    case 801: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(int e) { return cudaGetErrorName(e); }
// No CUDA IPC between processes here: libfabric's shm then moves device memory through copies.
int cudaIpcGetMemHandle(void*, void*) { return 801; }
int cudaIpcOpenMemHandle(void**, ...) { return 801; }  // its handle comes by value (64 bytes): never read
int cudaIpcCloseMemHandle(void*) { return 801; }

int weftMockCudaCpuWindow(const void* ptr, size_t len, int on) {
  std::lock_guard<std::mutex> lock(gMutex);
  Allocation* a = find(reinterpret_cast<uintptr_t>(ptr), len);
  if (a == nullptr) return kInvalidValue;
  if (!on && a->windows == 0) return kInvalidValue;
  a->windows += on ? 1 : -1;
  if (on) ++gWindows;
  int prot = a->windows > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;
  return mprotect(reinterpret_cast<void*>(a->base.load()), a->mapped, prot) == 0 ? kSuccess : kInvalidValue;
}

int weftMockCudaOwns(const void* addr, uintptr_t* base, size_t* size) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(addr);
  const int used = gUsed.load(std::memory_order_acquire);
  for (int i = 0; i < used; ++i) {
    const Allocation& a = gAlloc[i];
    uintptr_t b = a.base.load(std::memory_order_acquire);
    if (b == 0) continue;
    size_t s = a.size.load(std::memory_order_acquire);
    if (p >= b && p < b + pageRound(s)) {
      if (base != nullptr) *base = b;
      if (size != nullptr) *size = s;
      return 1;
    }
  }
  return 0;
}

void weftMockCudaGetStats(WeftMockCudaStats* out) {
  if (out == nullptr) return;
  out->allocations = gLive.load();
  out->dmabufExports = gDmabufs.load();
  out->flushes = gFlushes.load();
  out->cpuWindows = gWindows.load();
  out->runtimeCopies = gRuntimeCopies.load();
  out->synchronizes = gSynchronizes.load();
}

}  // extern "C"
