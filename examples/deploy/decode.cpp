// Greedy decoding with the exported shipped decoder (examples/models/decoder.py), in C++ alone:
// graphex::Module from the installed package (find_package(graphex)), no Python.
//
//   decode ARTIFACT STATE.safetensors STEPS
//
// ARTIFACT: the directory graphex.export wrote (examples/deploy/demo.py). STATE: the first step's
// inputs, named tokens [B, 1] int64, pos [1] int64, k_cache, v_cache (zeros). Each step runs the
// program on (tokens, pos, k_cache, v_cache) (the program writes this step's keys and values into
// the caches in place), takes the argmax of the last logits as the next tokens and advances pos.
// Prints the generated tokens on one line ("tokens: 17 4 ..."), then the load time, the time to
// the first logits and the median step time.
#include <graphex/graphex.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: decode ARTIFACT STATE.safetensors STEPS\n";
    return 2;
  }
  try {
    auto t0 = Clock::now();
    graphex::Module module = graphex::Module::load(argv[1]);
    double load_ms = msSince(t0);
    std::map<std::string, at::Tensor> state = graphex::deploy::loadSafetensors(argv[2]);
    for (const char* name : {"tokens", "pos", "k_cache", "v_cache"})
      if (!state.count(name)) throw std::runtime_error(std::string(argv[2]) + " has no tensor '" + name + "'");
    // The file is mapped read-only: the program writes the caches, so it gets copies.
    at::Tensor tokens = state["tokens"].clone(), pos = state["pos"].clone();
    at::Tensor k_cache = state["k_cache"].clone(), v_cache = state["v_cache"].clone();
    long steps = std::strtol(argv[3], nullptr, 10);

    std::vector<long> generated;
    std::vector<double> step_us;
    double first_ms = 0;
    for (long step = 0; step < steps; ++step) {
      auto t = Clock::now();
      std::vector<c10::IValue> out = module.run({tokens, pos, k_cache, v_cache});
      double us = std::chrono::duration<double, std::micro>(Clock::now() - t).count();
      if (step == 0) first_ms = msSince(t0);
      else step_us.push_back(us);
      at::Tensor logits = out.at(0).toTensor();      // [B, 1, vocab]
      tokens = logits.select(1, -1).argmax(-1, /*keepdim=*/true);  // [B, 1]
      pos = pos.add(1);
      generated.push_back(tokens[0][0].item<int64_t>());
    }
    std::cout << "tokens:";
    for (long t : generated) std::cout << " " << t;
    std::cout << "\n";
    std::sort(step_us.begin(), step_us.end());
    std::printf("load: %.1f ms, first logits after %.1f ms, median step: %.1f us over %zu steps\n", load_ms, first_ms,
                step_us.empty() ? 0.0 : step_us[step_us.size() / 2], step_us.size());
  } catch (const std::exception& e) {
    std::cerr << "decode: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
