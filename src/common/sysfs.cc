// SPDX-License-Identifier: Apache-2.0
#include "weft/common/sysfs.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace weft::sysfs {

std::string readLine(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return {};
  char buf[256];
  std::string s;
  if (std::fgets(buf, sizeof(buf), f) != nullptr) s = buf;
  std::fclose(f);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

std::string realPath(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) return {};
  return buf;
}

bool isPciBusId(const std::string& c) {  // dddd:bb:dd.f
  if (c.size() != 12 || c[4] != ':' || c[7] != ':' || c[10] != '.') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9, 11}) {
    if (!std::isxdigit(static_cast<unsigned char>(c[i]))) return false;
  }
  return true;
}

std::string pciAncestor(std::string p) {
  while (!p.empty()) {
    size_t slash = p.rfind('/');
    if (slash == std::string::npos) break;
    if (isPciBusId(p.substr(slash + 1))) return p;
    p.erase(slash);
  }
  return {};
}

std::string netdevPciPath(const std::string& ifname, const std::string& root) {
  return pciAncestor(realPath(root + "/class/net/" + ifname + "/device"));
}

int netdevSpeedMbps(const std::string& ifname, const std::string& root) {
  std::string s = readLine(root + "/class/net/" + ifname + "/speed");
  char* end = nullptr;
  long v = s.empty() ? 0 : std::strtol(s.c_str(), &end, 10);
  if (end == nullptr || *end != '\0' || v <= 0 || v > INT_MAX) return 10000;
  return static_cast<int>(v);
}

namespace {

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

// The 16 bytes of a GID as sysfs prints it ("fe80:0000:...:0001"); false when malformed.
bool parseGid(const std::string& s, unsigned char out[16]) {
  std::string compact;
  for (char c : s)
    if (c != ':') compact += c;
  if (compact.size() != 32) return false;
  for (int i = 0; i < 16; ++i) {
    char byte[3] = {compact[2 * i], compact[2 * i + 1], 0};
    char* end = nullptr;
    long v = std::strtol(byte, &end, 16);
    if (end != byte + 2) return false;
    out[i] = static_cast<unsigned char>(v);
  }
  return true;
}

// The GID an address appears as: IPv6 itself, IPv4 mapped (::ffff:a.b.c.d).
bool gidOf(const sockaddr* src, unsigned char out[16]) {
  if (src == nullptr) return false;
  if (src->sa_family == AF_INET6) {
    std::memcpy(out, &reinterpret_cast<const sockaddr_in6*>(src)->sin6_addr, 16);
    return true;
  }
  if (src->sa_family == AF_INET) {
    std::memset(out, 0, 16);
    out[10] = out[11] = 0xff;
    std::memcpy(out + 12, &reinterpret_cast<const sockaddr_in*>(src)->sin_addr, 4);
    return true;
  }
  return false;
}

}  // namespace

LinkSource linkSourceFor(const std::string& name, const sockaddr* src, const std::string& root) {
  LinkSource s;
  if (name.empty() || name.find('/') != std::string::npos) {
    s.describe = "none: no device name";
    return s;
  }
  const std::string net = root + "/class/net/" + name + "/operstate";
  if (exists(net)) {
    s.kind = LinkSource::Kind::kNetdev;
    s.path = net;
    s.describe = "netdev " + name;
    return s;
  }
  std::string dev = name;
  for (const char* suffix : {"-rdm", "-dgrm", "-xrc"}) {
    const size_t n = std::strlen(suffix);
    if (!exists(root + "/class/infiniband/" + dev) && dev.size() > n && dev.compare(dev.size() - n, n, suffix) == 0)
      dev.erase(dev.size() - n);
  }
  const std::string ports = root + "/class/infiniband/" + dev + "/ports";
  std::vector<std::string> list = entries(ports);
  if (list.empty()) {
    s.describe = "none: sysfs has no network interface or RDMA device " + name;
    return s;
  }
  std::string port;
  std::string how;
  if (list.size() == 1) {
    port = list[0];
  } else {
    unsigned char want[16];
    if (gidOf(src, want)) {
      for (const std::string& p : list) {
        for (const std::string& g : entries(ports + "/" + p + "/gids")) {
          unsigned char gid[16];
          if (parseGid(readLine(ports + "/" + p + "/gids/" + g), gid) && std::memcmp(gid, want, 16) == 0) port = p;
        }
        if (!port.empty()) break;
      }
    }
    if (port.empty()) {
      port = "1";
      how = " (its source address is in no port's GID table: port 1 assumed)";
    }
  }
  s.kind = LinkSource::Kind::kRdmaPort;
  s.path = ports + "/" + port + "/state";
  s.describe = dev + " port " + port + how;
  return s;
}

bool linkUp(const LinkSource& s) {
  if (s.kind == LinkSource::Kind::kNone) return true;
  std::string st = readLine(s.path);
  if (st.empty()) return true;
  if (s.kind == LinkSource::Kind::kNetdev) return st.rfind("up", 0) == 0 || st.rfind("unknown", 0) == 0;
  return st.find("ACTIVE") != std::string::npos;  // "4: ACTIVE"
}

}  // namespace weft::sysfs
