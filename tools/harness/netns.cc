// SPDX-License-Identifier: Apache-2.0
#include "netns.h"

#include <net/if.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace weft::harness {

bool privateNetns() {
  // tests/rxe/run_guest.sh's QEMU guest (its kernel command line names the output folder): a machine of its own,
  // thrown away after the test, whose links may be taken down.
  if (std::ifstream cmdline("/proc/cmdline"); cmdline) {
    std::string line;
    std::getline(cmdline, line);
    if (line.find(" weft_out=") != std::string::npos) return true;
  }
  struct stat self {}, parent {};
  std::string p = "/proc/" + std::to_string(getppid()) + "/ns/net";
  if (stat("/proc/self/ns/net", &self) != 0 || stat(p.c_str(), &parent) != 0) return false;
  return self.st_ino != parent.st_ino || self.st_dev != parent.st_dev;
}

std::string setNetnsLinks(bool up) {
  // The interfaces from netlink in this process's own namespace: /sys/class/net shows the namespace sysfs was
  // mounted in, which for a process that joined another (joinNetns) is still the host's.
  struct if_nameindex* list = if_nameindex();
  if (list == nullptr) return std::string("cannot list this namespace's interfaces: ") + std::strerror(errno);
  std::string err;
  for (struct if_nameindex* i = list; i->if_index != 0 && i->if_name != nullptr; ++i) {
    const std::string n = i->if_name;
    if (n == "lo") continue;
    std::string cmd = "ip link set dev " + n + (up ? " up" : " down");
    if (std::system(cmd.c_str()) != 0 && err.empty()) err = "'" + cmd + "' failed";
  }
  if_freenameindex(list);
  return err;
}

std::string joinNetns(const std::string& name) {
  const std::string path = "/var/run/netns/" + name;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "cannot open " + path + ": " + std::strerror(errno);
  const int rc = setns(fd, CLONE_NEWNET);
  const int err = errno;
  close(fd);
  return rc == 0 ? "" : "setns into " + path + " failed: " + std::strerror(err);
}

}  // namespace weft::harness
