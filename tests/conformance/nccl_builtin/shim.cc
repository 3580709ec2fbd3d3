// SPDX-License-Identifier: Apache-2.0
// NCCL's own net transports as a plugin file. An unstripped libnccl.so.2 holds its Socket and IB transports as
// tables of the net plugin shape (local data symbols ncclNetSocket, ncclNetIb; the v11 layout in NCCL 2.28): this
// library loads it, copies one table (at the offset nm found, WEFT_TABLE_OFFSET) into an exported
// ncclNetPlugin_v11, and so lets the harness drive NCCL's transport exactly as it drives weft. A test tool only.
//
// NCCL's Socket transport names its helper threads after the current CUDA device, asked of the CUDA runtime
// linked into libnccl.so.2; without a driver that call fails the whole transport. Where nm found it
// (WEFT_GETDEVICE_OFFSET), the function is made to answer device 0 (x86-64 only: the body is machine code).
#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "weft/nccl/net.h"

#ifndef WEFT_NCCL_LIB
#define WEFT_NCCL_LIB "libnccl.so.2"
#endif

extern "C" {
__attribute__((visibility("default"))) ncclNet_v11_t ncclNetPlugin_v11;
}

namespace {

#if defined(WEFT_GETDEVICE_OFFSET) && defined(__x86_64__)
// int cudaGetDevice(int* dev) { *dev = 0; return 0; }: movl $0,(%rdi); xorl %eax,%eax; ret
void answerDeviceZero(uintptr_t base) {
  static const unsigned char kBody[] = {0xC7, 0x07, 0x00, 0x00, 0x00, 0x00, 0x31, 0xC0, 0xC3};
  auto* fn = reinterpret_cast<unsigned char*>(base + static_cast<uintptr_t>(WEFT_GETDEVICE_OFFSET));
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  auto* first = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(fn) & ~(page - 1));
  if (mprotect(first, 2 * page, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) {
    std::perror("nccl-builtin shim: mprotect");
    return;
  }
  std::memcpy(fn, kBody, sizeof(kBody));
  mprotect(first, 2 * page, PROT_READ | PROT_EXEC);
}
#endif

__attribute__((constructor)) void loadTable() {
  void* lib = dlopen(WEFT_NCCL_LIB, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "nccl-builtin shim: cannot open %s: %s\n", WEFT_NCCL_LIB, dlerror());
    return;
  }
  link_map* map = nullptr;
  if (dlinfo(lib, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr) {
    std::fprintf(stderr, "nccl-builtin shim: no link map for %s\n", WEFT_NCCL_LIB);
    return;
  }
  const uintptr_t base = static_cast<uintptr_t>(map->l_addr);
#if defined(WEFT_GETDEVICE_OFFSET) && defined(__x86_64__)
  answerDeviceZero(base);
#endif
  std::memcpy(&ncclNetPlugin_v11, reinterpret_cast<const void*>(base + static_cast<uintptr_t>(WEFT_TABLE_OFFSET)),
              sizeof(ncclNetPlugin_v11));
}

}  // namespace
