// SPDX-License-Identifier: Apache-2.0
// The one table of WEFT_* environment variables. Each is declared once (kind, default, range, one line of doc),
// parsed strictly when first needed (garbage is an error, never a silent 0), logged with its source, and listed
// by `weft info`. No other code reads the environment.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace weft::params {

enum class Kind { kString, kInt, kBool, kChoice };

struct Def {
  const char* name;
  Kind kind;
  const char* defaultValue;
  int64_t min;          // kInt only
  int64_t max;          // kInt only
  const char* choices;  // kChoice only: '|'-separated
  const char* doc;
};

struct Value {
  const Def* def;
  std::string raw;     // as found in the environment (or the default)
  bool fromEnv;        // false: the default
  bool valid;          // false: `error` says why, and the default is in effect
  std::string error;
  int64_t i;           // kInt, kBool (0/1)
  std::string s;       // kString, kChoice
};

const std::vector<Def>& definitions();

// Parsed values (parsed once per process; reload() re-reads the environment, for tests and tools).
const std::vector<Value>& values();
void reload();

int64_t getInt(std::string_view name);
bool getBool(std::string_view name);
const std::string& getString(std::string_view name);

// Every problem found: invalid values, and WEFT_* variables that are not ours (typos). Empty when all is well.
std::vector<std::string> problems();

// Strict parsers, exposed for tests.
bool parseInt(std::string_view text, int64_t min, int64_t max, int64_t* out, std::string* error);
bool parseBool(std::string_view text, bool* out, std::string* error);
// The fields of `text` between separators, empty ones kept ("a::b" -> a, "", b; "" -> one empty field).
std::vector<std::string> splitFields(std::string_view text, char sep);

// Settings of the libraries below weft (libfabric's providers, rdma-core) that weft chooses where the user has not
// set them. They are those libraries' own environment variables, read by them, so weft sets them in its process
// before the first fi_getinfo or device list; a value the user set is always kept.
struct ForeignDefault {
  const char* name;
  const char* value;
  const char* why;
};
const std::vector<ForeignDefault>& foreignDefaults();

struct ForeignSetting {
  const ForeignDefault* def;
  std::string value;  // in effect
  bool fromUser;      // the user's own value, kept (false: weft set it)
};
// Sets every foreign default the environment lacks, once per process (later calls only report), and returns what
// is in effect. Thread-safe; call it before libfabric or libibverbs is first used.
const std::vector<ForeignSetting>& applyForeignDefaults();
// The same decision made now, against the current environment (for tests; the plugin uses the call above).
std::vector<ForeignSetting> applyForeignDefaultsNow();

// A reader of NCCL's own variables that weft must honour (for example NCCL_DEBUG in our tools).
const char* foreign(const char* name);

}  // namespace weft::params
