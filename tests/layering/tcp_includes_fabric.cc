// SPDX-License-Identifier: Apache-2.0
// Built as part of the TCP backend's layer (it links weft_tcp only): including the libfabric backend's header must
// fail to build, because a layer sees only the headers of the layers it links (CMakeLists.txt, weft_layer_headers).
// ctest layering.backend_cannot_include_another expects exactly that error.
#include "fabric/fabric_comm.h"
