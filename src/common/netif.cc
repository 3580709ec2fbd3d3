// SPDX-License-Identifier: Apache-2.0
#include "weft/common/netif.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>

namespace weft {

bool matchInterface(const std::string& name, const std::string& spec) {
  std::string s = spec;
  bool exclude = false, exact = false;
  if (!s.empty() && s[0] == '^') {
    exclude = true;
    s.erase(0, 1);
  }
  if (!s.empty() && s[0] == '=') {
    exact = true;
    s.erase(0, 1);
  }
  bool matched = false;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty() && (exact ? name == item : name.rfind(item, 0) == 0)) matched = true;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return exclude ? !matched : matched;
}

bool isLoopbackOrBridge(const std::string& name) {
  return name == "lo" || name.rfind("docker", 0) == 0 || name.rfind("virbr", 0) == 0;
}

std::string sockaddrString(const sockaddr* sa, bool withPort) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &s->sin_addr, host, sizeof(host));
    return withPort ? std::string(host) + ":" + std::to_string(ntohs(s->sin_port)) : host;
  }
  if (sa->sa_family == AF_INET6) {
    auto* s = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof(host));
    return withPort ? "[" + std::string(host) + "]:" + std::to_string(ntohs(s->sin6_port)) : host;
  }
  return "?";
}

std::string localAddressOf(int fd) {
  sockaddr_storage sa{};
  socklen_t len = sizeof(sa);
  if (fd < 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return {};
  return sockaddrString(reinterpret_cast<sockaddr*>(&sa));
}

int bindTcpSocket(sockaddr_storage addr, socklen_t len, int flags) {
  if (addr.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&addr)->sin_port = 0;
  if (addr.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = 0;
  int fd = ::socket(addr.ss_family, SOCK_STREAM | flags, 0);
  if (fd < 0) return -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

}  // namespace weft
