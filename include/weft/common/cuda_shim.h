// GPU memory support without a link-time CUDA dependency: libcuda is opened at run time, only when a GPU
// buffer is actually registered. The plugin must load (RTLD_NOW) on machines without any CUDA at all.
#pragma once

namespace weft::cuda {

// True when this build carries the GPU paths (CUDA toolkit found at configure time).
bool compiledIn();
// The CUDA device ordinal owning `ptr`, or -1 (and `why`) when it cannot be determined.
int deviceOfPointer(const void* ptr, const char** why);

}  // namespace weft::cuda
