// SPDX-License-Identifier: Apache-2.0
#include "weft/common/cuda_shim.h"

#include <dlfcn.h>

#include <atomic>
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

}  // namespace weft::cuda
