// SPDX-License-Identifier: Apache-2.0
#include "fabric/rails.h"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <fstream>

#include "weft/common/params.h"
#include "weft/common/sysfs.h"

namespace weft::fabric {

namespace {


std::vector<std::string> splitOn(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) return out;
    start = pos + 1;
  }
}

size_t commonPrefix(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}


}  // namespace

bool parseNicRails(const std::string& text, std::map<std::string, NicRail>* out, std::string* error) {
  out->clear();
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? text.size() : comma + 1;
    if (item.empty()) continue;
    const std::vector<std::string> f = params::splitFields(item, ':');
    if (f[0].empty() || f.size() < 2 || f.size() > 3) {
      *error = "'" + item + "': want NIC:rail or NIC:rail:plane";
      return false;
    }
    NicRail r;
    int* field[2] = {&r.rail, &r.plane};
    for (size_t k = 1; k < f.size(); ++k) {
      const std::string& v = f[k];
      if (v.empty() || v.size() > 5 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
          std::stoi(v) > 32767) {
        *error = "'" + item + "': the " + (k == 1 ? "rail" : "plane") + " must be a number from 0 to 32767";
        return false;
      }
      *field[k - 1] = std::stoi(v);
    }
    if (!out->emplace(f[0], r).second) {
      *error = "NIC " + f[0] + " named twice";
      return false;
    }
  }
  return true;
}

bool parseRailSpec(const std::string& text, RailSpec* out, std::string* error) {
  *out = RailSpec{};
  if (text.empty() || text == "auto") return true;
  if (text == "off") {
    out->mode = RailSpec::Mode::kOff;
    return true;
  }
  out->mode = RailSpec::Mode::kExplicit;
  for (const std::string& g : splitOn(text, ',')) {
    std::vector<std::string> names = splitOn(g, '+');
    for (const auto& n : names) {
      if (n.empty() || n.find_first_of(" \t") != std::string::npos) {
        *error = "group '" + g + "' has an empty or blank NIC name (expected e.g. eth0+eth1,eth2+eth3)";
        return false;
      }
    }
    if (static_cast<int>(names.size()) > maxDevsPerNic()) {
      *error = "group '" + g + "' names " + std::to_string(names.size()) + " NICs; a device holds at most " +
               std::to_string(maxDevsPerNic()) +
               (maxDevsPerNic() < kMaxDevsPerNic ? " with NCCL's net tables before v12 (8 on v12, NCCL 2.30+)" : "");
      return false;
    }
    out->groups.push_back(std::move(names));
  }
  return true;
}

std::vector<std::string> pciChain(const std::string& sysfsPath) {
  std::vector<std::string> out;
  for (const auto& c : splitOn(sysfsPath, '/')) {
    if (isPciBusId(c)) out.push_back(c);
  }
  return out;
}

std::vector<std::vector<int>> groupRails(const std::vector<NicInfo>& nics, const std::vector<std::string>& gpuPaths,
                                         const RailSpec& spec, std::vector<std::string>* warnings) {
  const int n = static_cast<int>(nics.size());
  std::vector<int> groupOf(n, -1);
  std::vector<std::vector<int>> groups;
  if (spec.mode == RailSpec::Mode::kExplicit) {
    for (const auto& names : spec.groups) {
      std::vector<int> members;
      bool ok = true;
      for (const auto& name : names) {
        auto it = std::find_if(nics.begin(), nics.end(), [&](const NicInfo& x) { return x.name == name; });
        if (it == nics.end()) {
          std::string known;
          for (const auto& x : nics) known += (known.empty() ? "" : ", ") + x.name;
          warnings->push_back("WEFT_RAILS names NIC '" + name + "', which is not among this provider's devices (" +
                              known + "): group left unfused");
          ok = false;
          break;
        }
        int idx = static_cast<int>(it - nics.begin());
        if (groupOf[idx] != -1 || std::find(members.begin(), members.end(), idx) != members.end()) {
          warnings->push_back("WEFT_RAILS names NIC '" + name + "' in more than one place: group left unfused");
          ok = false;
          break;
        }
        members.push_back(idx);
      }
      if (!ok || members.size() < 2) continue;
      for (int m : members) groupOf[m] = static_cast<int>(groups.size());
      groups.push_back(std::move(members));
    }
  } else if (spec.mode == RailSpec::Mode::kAuto) {
    for (const auto& gpu : gpuPaths) {
      const auto gchain = pciChain(gpu);
      if (gchain.size() < 2) continue;  // a GPU straight on a root complex: nothing shares its switch
      std::vector<int> members;
      for (int i = 0; i < n && static_cast<int>(members.size()) < maxDevsPerNic(); ++i) {
        if (groupOf[i] != -1 || nics[i].pciPath.empty()) continue;
        const auto nchain = pciChain(nics[i].pciPath);
        // Below the same root port, but not the GPU itself (a NIC on the GPU's own function would be odd).
        if (commonPrefix(gchain, nchain) < 1 || nchain == gchain) continue;
        if (!members.empty() && nics[members[0]].speedMbps != nics[i].speedMbps) continue;
        members.push_back(i);
      }
      if (members.size() < 2) continue;
      for (int m : members) groupOf[m] = static_cast<int>(groups.size());
      groups.push_back(std::move(members));
    }
  }
  // Every NIC appears once: fused groups at the position of their first NIC, the rest alone.
  std::vector<std::vector<int>> out;
  std::vector<bool> emitted(groups.size(), false);
  for (int i = 0; i < n; ++i) {
    if (groupOf[i] == -1) {
      out.push_back({i});
    } else if (!emitted[groupOf[i]]) {
      emitted[groupOf[i]] = true;
      out.push_back(groups[groupOf[i]]);
    }
  }
  return out;
}

std::vector<std::string> findGpuPciPaths() {
  std::vector<std::string> out;
  const std::string root = "/sys/bus/pci/devices";
  DIR* d = opendir(root.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string dev = root + "/" + e->d_name;
    std::string cls = sysfs::readLine(dev + "/class");       // 0x030200: 3D controller, 0x030000: VGA
    std::string vendor = sysfs::readLine(dev + "/vendor");   // 0x10de NVIDIA, 0x1002 AMD
    if (cls.rfind("0x0302", 0) != 0 && cls.rfind("0x0300", 0) != 0) continue;
    if (vendor != "0x10de" && vendor != "0x1002") continue;
    char buf[PATH_MAX];
    if (::realpath(dev.c_str(), buf) != nullptr) out.push_back(buf);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace weft::fabric
