// libFuzzer target: graphex::Module::load on arbitrary bytes (tests/python/test_fuzz_loader.py runs it
// for a bounded time; `make fuzz-loader` runs it longer and merges what it finds into corpus/).
//
// Input layout: u32 little-endian n, then n bytes of program.gxp, then the rest as
// weights.safetensors. Both files are written into a private directory and loaded as an artifact.
//
// Note [Bad files never crash]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Whatever the bytes (truncated, corrupt, foreign, another format version, weights that do not match),
// Module::load either succeeds or throws an exception with a message; a crash, a hang, an
// AddressSanitizer report or an exception that is not a std::exception is a bug the fuzzer reports.
#include "deploy/module.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

namespace {

const std::filesystem::path& scratchDir() {
  // Never destroyed (the exit handler below runs after static destructors would have).
  static const auto* dir = [] {
    auto* d = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                        ("graphex-fuzz-load-" + std::to_string(getpid())));
    std::filesystem::create_directories(*d);
    std::atexit([] {  // libFuzzer ends with exit(): leave nothing in /tmp
      std::error_code ec;
      std::filesystem::remove_all(scratchDir(), ec);
    });
    return d;
  }();
  return *dir;
}

void writeFile(const std::filesystem::path& path, const uint8_t* data, size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t n = 0;
  std::memcpy(&n, data, 4);
  data += 4;
  size -= 4;
  n = std::min<uint32_t>(n, static_cast<uint32_t>(size));
  auto dir = scratchDir();
  writeFile(dir / "program.gxp", data, n);
  writeFile(dir / "weights.safetensors", data + n, size - n);
  try {
    graphex::Module m = graphex::Module::load(dir.string());
    (void)m.numArguments();
  } catch (const std::exception&) {
    // A clear error is the expected outcome for a bad file (Note [Bad files never crash]).
  }
  return 0;
}
