// SPDX-License-Identifier: Apache-2.0
// GPU memory support without a link-time CUDA dependency: libcuda is opened at run time, only when a GPU
// buffer is actually registered. The plugin must load (RTLD_NOW) on machines without any CUDA at all.
#pragma once

namespace weft::cuda {

// True when this build carries the GPU paths (CUDA toolkit found at configure time).
bool compiledIn();
// True when the CUDA driver (libcuda.so.1) can be loaded: a machine with an NVIDIA driver.
bool driverPresent();
// The CUDA device ordinal owning `ptr`, or -1 (and `why`) when it cannot be determined.
int deviceOfPointer(const void* ptr, const char** why);

}  // namespace weft::cuda
