// Network interface selection in NCCL_SOCKET_IFNAME syntax, shared by the backends (WEFT_IFACE for libfabric's
// domains and for the interfaces verbs takes RoCE addresses from).
#pragma once

#include <string>

namespace weft {

// True when `name` is selected by `spec`: comma-separated name prefixes, '^' first excludes them, '=' first
// makes them exact names. An empty spec selects nothing here (callers decide what empty means).
bool matchInterface(const std::string& name, const std::string& spec);

}  // namespace weft
