// SPDX-License-Identifier: Apache-2.0
// Network interface selection in NCCL_SOCKET_IFNAME syntax, shared by the backends (WEFT_IFACE for libfabric's
// domains and for the interfaces verbs takes RoCE addresses from).
#pragma once

#include <sys/socket.h>

#include <string>

namespace weft {

// True when `name` is selected by `spec`: comma-separated name prefixes, '^' first excludes them, '=' first
// makes them exact names. An empty spec selects nothing here (callers decide what empty means).
bool matchInterface(const std::string& name, const std::string& spec);

// Loopback and container bridges (docker*, virbr*): left out when WEFT_IFACE is empty, unless nothing else exists.
bool isLoopbackOrBridge(const std::string& name);

// "1.2.3.4:port" or "[v6]:port" (without the port when withPort is false); "?" for another family.
std::string sockaddrString(const sockaddr* sa, bool withPort = true);
// The address socket `fd` is bound to (getsockname), as sockaddrString writes it; empty where it has none.
std::string localAddressOf(int fd);
// A TCP socket (`flags` as for socket(2)) bound to `addr` with port 0, the kernel picking one; -1 with errno set.
int bindTcpSocket(sockaddr_storage addr, socklen_t len, int flags);

}  // namespace weft
