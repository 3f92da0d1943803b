// graphex-run: load an exported artifact and run it, with libtorch alone (no Python).
//
//   graphex-run PATH [--inputs FILE] [--output FILE] [--bench N] [--load-library LIB]...
//
// PATH is a directory written by graphex.export (or `graphex export`). --inputs is a safetensors
// file holding the positional arguments named "0", "1", ...; --output writes the flattened result
// the same way (Note [graphex-run's files are flat and named by position]). --bench N runs N more
// times after the first run and prints the median step time (with p10 and p90) and the time from
// the start of loading to the first output (bench/cpp_runner.py reads both lines). --load-library dlopens a library
// with TORCH_LIBRARY operators (custom ops) before the artifact is loaded.
//
// Note [graphex-run's files are flat and named by position]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Inputs "0".."n-1" are the caller's flattened arguments in order (exactly n: a gap or an extra
// name is an error, not a silent default). Outputs "0".."m-1" are the result's leaves in order;
// a number or bool leaf is written as a 0-dim tensor (int64, float64, bool) so that one file
// format holds every leaf, and a None leaf is left out (its position stays unused).
#include "deploy/module.h"
#include "deploy/safetensors.h"

#include <ATen/ops/scalar_tensor.h>

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace {

const char* kUsage =
    "usage: graphex-run PATH [--inputs FILE] [--output FILE] [--bench N] [--load-library LIB]...\n"
    "  PATH                an artifact directory written by graphex.export / `graphex export`\n"
    "  --inputs FILE       safetensors file with the positional arguments named \"0\", \"1\", ...\n"
    "  --output FILE       write the flattened result as safetensors, leaves named \"0\", \"1\", ...\n"
    "  --bench N           run N more times and print the median run time\n"
    "  --load-library LIB  load a library of TORCH_LIBRARY operators first (repeatable)\n";

int usage(const std::string& why) {
  std::cerr << "graphex-run: " << why << "\n" << kUsage;
  return 2;
}

std::vector<c10::IValue> readInputs(const std::string& file) {
  std::map<std::string, at::Tensor> named = graphex::deploy::loadSafetensors(file);
  std::vector<c10::IValue> args;
  for (size_t i = 0; i < named.size(); ++i) {
    auto it = named.find(std::to_string(i));
    if (it == named.end())
      throw std::runtime_error(file + " has " + std::to_string(named.size()) + " tensors but none named \"" +
                               std::to_string(i) + "\": name the positional inputs \"0\", \"1\", ...");
    // The mapping is private and read-only in spirit: hand the program a tensor it may own.
    args.emplace_back(it->second.clone());
  }
  return args;
}

std::map<std::string, at::Tensor> flatOutputs(const std::vector<c10::IValue>& result) {
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < result.size(); ++i) {
    const c10::IValue& v = result[i];
    std::string name = std::to_string(i);
    if (v.isTensor()) out.emplace(name, v.toTensor());
    else if (v.isInt()) out.emplace(name, at::scalar_tensor(v.toInt(), at::kLong));
    else if (v.isDouble()) out.emplace(name, at::scalar_tensor(v.toDouble(), at::kDouble));
    else if (v.isBool()) out.emplace(name, at::scalar_tensor(v.toBool(), at::kBool));
    else if (!v.isNone())
      throw std::runtime_error("result leaf " + name + " is a " + v.tagKind() + ", which --output cannot write");
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path, inputs_file, output_file;
  long bench = 0;
  std::vector<std::string> libraries;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (a == "--inputs" || a == "--output" || a == "--bench" || a == "--load-library") {
      const char* v = value();
      if (!v) return usage(a + " needs a value");
      if (a == "--inputs") inputs_file = v;
      else if (a == "--output") output_file = v;
      else if (a == "--load-library") libraries.emplace_back(v);
      else {
        char* end = nullptr;
        bench = std::strtol(v, &end, 10);
        if (*end || bench < 1) return usage("--bench takes a positive number of runs, not '" + std::string(v) + "'");
      }
    } else if (!a.empty() && a[0] == '-') {
      return usage("unknown option " + a);
    } else if (path.empty()) {
      path = a;
    } else {
      return usage("one PATH only (got '" + path + "' and '" + a + "')");
    }
  }
  if (path.empty()) return usage("PATH is required");
  try {
    for (const std::string& lib : libraries)
      if (!dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL))
        throw std::runtime_error("--load-library " + lib + ": " + dlerror());
    auto load_start = std::chrono::steady_clock::now();
    graphex::Module module = graphex::Module::load(path);
    double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - load_start).count();
    std::vector<c10::IValue> args;
    if (!inputs_file.empty()) args = readInputs(inputs_file);
    else if (module.numArguments() > 0)
      return usage(path + " takes " + std::to_string(module.numArguments()) +
                   " arguments: pass them with --inputs FILE (safetensors, named \"0\", \"1\", ...)");
    std::vector<c10::IValue> result = module.run(args);
    double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - load_start).count();
    if (!output_file.empty()) graphex::deploy::saveSafetensors(output_file, flatOutputs(result));
    if (bench > 0) {
      std::vector<double> us;
      us.reserve(bench);
      for (long k = 0; k < bench; ++k) {
        auto t0 = std::chrono::steady_clock::now();
        result = module.run(args);
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(us.begin(), us.end());
      std::printf("median run time: %.1f us over %ld runs (p10 %.1f us, p90 %.1f us)\n", us[us.size() / 2], bench,
                  us[us.size() / 10], us[us.size() * 9 / 10]);
      std::printf("load: %.2f ms, first output after %.2f ms (inputs read, program and weights loaded, one run)\n",
                  load_ms, first_ms);
    }
  } catch (const std::exception& e) {
    std::cerr << "graphex-run: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
