// SPDX-License-Identifier: Apache-2.0
// The weft tool from inside a worker (self_exec.h).
#include "self_exec.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>

namespace weft::harness {

std::string runWeft(const std::string& args) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "cannot read /proc/self/exe";
  self[n] = '\0';
  const std::string cmd = "'" + std::string(self) + "' " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return "could not run " + cmd;
  std::string out;
  char buf[4096];
  while (size_t k = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, k);
  ::pclose(p);
  return out;
}

bool hasDump(const std::string& dir, int pid) {
  const std::string want = "-" + std::to_string(pid) + "-";
  DIR* d = ::opendir((dir + "/hangs").c_str());
  if (d == nullptr) return false;
  bool found = false;
  while (dirent* e = ::readdir(d)) found = found || std::string(e->d_name).find(want) != std::string::npos;
  ::closedir(d);
  return found;
}

std::string reportHangs(const std::string& dir) { return runWeft("report --hangs '" + dir + "'"); }

}  // namespace weft::harness
