// SPDX-License-Identifier: Apache-2.0
#include "fabric/rails.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "weft/common/params.h"

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

std::vector<std::vector<int>> groupRails(const std::vector<NicInfo>& nics, const topo::Topology& topology,
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
    // NICs sharing their nearest GPUs (PIX or PXB) and their speed, in discovery order.
    std::map<std::pair<std::vector<int>, int>, std::vector<int>> shares;
    for (int i = 0; i < n; ++i) {
      const int pci = topology.pciOfNic(nics[i].name, nics[i].pciPath);
      if (pci < 0) {
        if (!nics[i].pciPath.empty() && !topology.empty() && topology.error().empty()) {
          warnings->push_back("NIC " + nics[i].name + " (" + nics[i].pciPath + ") is not in hwloc's view of this "
                              "machine (" + topology.source() + "): it stays a device of its own");
        }
        continue;
      }
      topo::Path path;
      std::vector<int> gpus = topology.nearestGpus(pci, &path);
      if (gpus.empty() || path > topo::Path::kPciTree) continue;
      shares[{gpus, nics[i].speedMbps}].push_back(i);
    }
    for (const auto& [key, members] : shares) {
      const size_t perGpu = members.size() / key.first.size();
      if (perGpu < 2) continue;
      const size_t take = std::min<size_t>(perGpu, static_cast<size_t>(maxDevsPerNic()));
      for (size_t g = 0; g < key.first.size(); ++g) {
        std::vector<int> group(members.begin() + g * perGpu, members.begin() + g * perGpu + take);
        for (int m : group) groupOf[m] = static_cast<int>(groups.size());
        groups.push_back(std::move(group));
      }
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

}  // namespace weft::fabric
