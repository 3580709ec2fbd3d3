// SPDX-License-Identifier: Apache-2.0
#include "weft/common/cuda_shim.h"

#include <dlfcn.h>

#include <atomic>
#include <cctype>
#include <mutex>

#ifdef WEFT_HAVE_CUDA
#include <cuda.h>
#endif

namespace weft::cuda {

bool compiledIn() {
#ifdef WEFT_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

bool driverPresent() {
#ifdef WEFT_HAVE_CUDA
  // Only a found driver is remembered: a process can load one later (a test that loads the mock, a library
  // loaded after the plugin's first look), and a failed dlopen is cheap at the few places that ask.
  static std::atomic<bool> present{false};
  if (present.load(std::memory_order_acquire)) return true;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);  // left open: deviceOfPointer opens the same library
  if (lib == nullptr) return false;
  present.store(true, std::memory_order_release);
  return true;
#else
  return false;
#endif
}

int deviceOfPointer(const void* ptr, const char** why) {
#ifdef WEFT_HAVE_CUDA
  using GetAttr = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
  static GetAttr getAttr = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) getAttr = reinterpret_cast<GetAttr>(dlsym(lib, "cuPointerGetAttribute"));
  });
  if (getAttr == nullptr) {
    *why = "libcuda.so.1 (the CUDA driver) could not be loaded";
    return -1;
  }
  int ordinal = -1;
  if (getAttr(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS) {
    *why = "cuPointerGetAttribute failed: not a CUDA device pointer";
    return -1;
  }
  return ordinal;
#else
  (void)ptr;
  *why = "weft was built without CUDA support";
  return -1;
#endif
}

std::string busIdOf(const void* ptr) {
#ifdef WEFT_HAVE_CUDA
  struct Api {
    CUresult (*ctxGetDevice)(CUdevice*) = nullptr;
    CUresult (*deviceGet)(CUdevice*, int) = nullptr;
    CUresult (*busId)(char*, int, CUdevice) = nullptr;
  };
  static Api api;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    api.ctxGetDevice = reinterpret_cast<decltype(api.ctxGetDevice)>(dlsym(lib, "cuCtxGetDevice"));
    api.deviceGet = reinterpret_cast<decltype(api.deviceGet)>(dlsym(lib, "cuDeviceGet"));
    api.busId = reinterpret_cast<decltype(api.busId)>(dlsym(lib, "cuDeviceGetPCIBusId"));
  });
  if (api.busId == nullptr) return {};
  CUdevice dev = 0;
  if (ptr != nullptr) {
    const char* why = nullptr;
    const int ordinal = deviceOfPointer(ptr, &why);
    if (ordinal < 0 || api.deviceGet == nullptr || api.deviceGet(&dev, ordinal) != CUDA_SUCCESS) return {};
  } else if (api.ctxGetDevice == nullptr || api.ctxGetDevice(&dev) != CUDA_SUCCESS) {
    return {};
  }
  char bus[32] = {};
  if (api.busId(bus, sizeof(bus), dev) != CUDA_SUCCESS) return {};
  std::string out(bus);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // CUDA writes the domain with 8 digits ("00000000:18:00.0"); sysfs and hwloc with 4.
  if (out.size() == 16 && out.compare(0, 4, "0000") == 0) out.erase(0, 4);
  return out;
#else
  (void)ptr;
  return {};
#endif
}

namespace {

#ifdef WEFT_HAVE_CUDA
struct CopyApi {
  CUresult (*htod)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*dtoh)(void*, CUdeviceptr, size_t) = nullptr;
  CUresult (*ctxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*ctxSetCurrent)(CUcontext) = nullptr;
  CUresult (*ctxSynchronize)() = nullptr;
  CUresult (*pointerGetAttribute)(void*, CUpointer_attribute, CUdeviceptr) = nullptr;
  CUresult (*errorString)(CUresult, const char**) = nullptr;
};

const CopyApi& copyApi() {
  static CopyApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    auto sym = [lib](const char* name) { return dlsym(lib, name); };
    api.htod = reinterpret_cast<decltype(api.htod)>(sym("cuMemcpyHtoD_v2"));
    api.dtoh = reinterpret_cast<decltype(api.dtoh)>(sym("cuMemcpyDtoH_v2"));
    api.ctxGetCurrent = reinterpret_cast<decltype(api.ctxGetCurrent)>(sym("cuCtxGetCurrent"));
    api.ctxSetCurrent = reinterpret_cast<decltype(api.ctxSetCurrent)>(sym("cuCtxSetCurrent"));
    api.ctxSynchronize = reinterpret_cast<decltype(api.ctxSynchronize)>(sym("cuCtxSynchronize"));
    api.pointerGetAttribute = reinterpret_cast<decltype(api.pointerGetAttribute)>(sym("cuPointerGetAttribute"));
    api.errorString = reinterpret_cast<decltype(api.errorString)>(sym("cuGetErrorString"));
  });
  return api;
}

bool failed(const CopyApi& api, CUresult r, const char* what, std::string* err) {
  if (r == CUDA_SUCCESS) return false;
  const char* s = nullptr;
  if (api.errorString != nullptr) api.errorString(r, &s);
  if (err != nullptr) *err = std::string(what) + " failed: " + (s != nullptr ? s : "CUDA error " + std::to_string(r));
  return true;
}

// A thread without a current context gets the one that owns `dptr` (NCCL's proxy threads have theirs already).
bool ensureContext(const CopyApi& api, const void* dptr, std::string* err) {
  if (api.ctxGetCurrent == nullptr || api.ctxSetCurrent == nullptr) return true;
  CUcontext cur = nullptr;
  if (api.ctxGetCurrent(&cur) == CUDA_SUCCESS && cur != nullptr) return true;
  if (api.pointerGetAttribute == nullptr) return true;
  CUcontext owner = nullptr;
  if (failed(api, api.pointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, reinterpret_cast<CUdeviceptr>(dptr)),
             "cuPointerGetAttribute(CONTEXT)", err)) {
    return false;
  }
  return !failed(api, api.ctxSetCurrent(owner), "cuCtxSetCurrent", err);
}
#endif

}  // namespace

bool copyToDevice(void* dst, const void* src, size_t n, std::string* err) {
#ifdef WEFT_HAVE_CUDA
  const CopyApi& api = copyApi();
  if (api.htod == nullptr) {
    if (err != nullptr) *err = "libcuda.so.1 (the CUDA driver) could not be loaded";
    return false;
  }
  if (n == 0) return true;
  if (!ensureContext(api, dst, err)) return false;
  return !failed(api, api.htod(reinterpret_cast<CUdeviceptr>(dst), src, n), "cuMemcpyHtoD", err);
#else
  (void)dst, (void)src, (void)n;
  if (err != nullptr) *err = "weft was built without CUDA support";
  return false;
#endif
}

bool copyFromDevice(void* dst, const void* src, size_t n, std::string* err) {
#ifdef WEFT_HAVE_CUDA
  const CopyApi& api = copyApi();
  if (api.dtoh == nullptr) {
    if (err != nullptr) *err = "libcuda.so.1 (the CUDA driver) could not be loaded";
    return false;
  }
  if (n == 0) return true;
  if (!ensureContext(api, src, err)) return false;
  return !failed(api, api.dtoh(dst, reinterpret_cast<CUdeviceptr>(src), n), "cuMemcpyDtoH", err);
#else
  (void)dst, (void)src, (void)n;
  if (err != nullptr) *err = "weft was built without CUDA support";
  return false;
#endif
}

bool synchronize(std::string* err) {
#ifdef WEFT_HAVE_CUDA
  const CopyApi& api = copyApi();
  if (api.ctxSynchronize == nullptr) {
    if (err != nullptr) *err = "libcuda.so.1 (the CUDA driver) could not be loaded";
    return false;
  }
  return !failed(api, api.ctxSynchronize(), "cuCtxSynchronize", err);
#else
  if (err != nullptr) *err = "weft was built without CUDA support";
  return false;
#endif
}

}  // namespace weft::cuda
