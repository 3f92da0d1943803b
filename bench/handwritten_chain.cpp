// The limit for the elementwise chain: the same ATen calls graphex replays, written by hand.
//
// Mirrors bench/cases.py's chain exactly: op i (0-based) is `x * mul` when i is even and
// `x + add` when i is odd, on a float32 tensor of `size` elements. The Python scalar
// becomes what Python's argument parser (and graphex's program) makes of it: a 0-dim
// double tensor flagged as a wrapped number, built once. Grad mode is off, as under
// torch.no_grad(). Each iteration is timed on its own; prints one line of JSON.
//
//   graphex_handwritten_chain [--ops 500] [--size 16] [--mul 1.0001] [--add 0.5]
//                             [--warmup 50] [--iters 200] [--seconds 0]
//
// --seconds S keeps iterating past --iters until S seconds have passed (after warmup).
// "check" is the sum of the chain applied to ones(size), for bench/run.py to compare
// against the Python definition.

#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Config {
  int ops = 500;
  int64_t size = 16;
  double mul = 1.0001;
  double add = 0.5;
  int warmup = 50;
  int iters = 200;
  double seconds = 0.0;
};

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "missing value for %s\n", flag.c_str());
      std::exit(2);
    }
    const char* v = argv[++i];
    if (flag == "--ops") c.ops = std::atoi(v);
    else if (flag == "--size") c.size = std::atoll(v);
    else if (flag == "--mul") c.mul = std::atof(v);
    else if (flag == "--add") c.add = std::atof(v);
    else if (flag == "--warmup") c.warmup = std::atoi(v);
    else if (flag == "--iters") c.iters = std::atoi(v);
    else if (flag == "--seconds") c.seconds = std::atof(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return c;
}

at::Tensor wrappedNumber(double value) {
  at::Tensor t = at::scalar_tensor(value, at::kDouble);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// One step: the whole chain, as graphex's program runs it.
at::Tensor chain(at::Tensor x, int ops, const at::Tensor& mul, const at::Tensor& add) {
  for (int i = 0; i < ops; ++i) {
    x = (i % 2 == 0) ? at::mul(x, mul) : at::add(x, add, 1);
  }
  return x;
}

double percentile(std::vector<double> sorted, double q) {
  if (sorted.empty()) return 0.0;
  double pos = q * static_cast<double>(sorted.size() - 1);
  size_t lo = static_cast<size_t>(pos);
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

}  // namespace

int main(int argc, char** argv) {
  const Config cfg = parse(argc, argv);
  c10::AutoGradMode no_grad(false);
  const at::Tensor mul = wrappedNumber(cfg.mul);
  const at::Tensor add = wrappedNumber(cfg.add);

  double check = 0.0;
  {
    at::Tensor out = chain(at::ones({cfg.size}, at::kFloat), cfg.ops, mul, add).contiguous();
    const float* p = out.data_ptr<float>();
    for (int64_t i = 0; i < out.numel(); ++i) check += p[i];
  }

  const at::Tensor x = at::randn({cfg.size}, at::kFloat);
  for (int i = 0; i < cfg.warmup; ++i) chain(x, cfg.ops, mul, add);

  using clock = std::chrono::steady_clock;
  std::vector<double> samples_us;
  samples_us.reserve(static_cast<size_t>(std::max(cfg.iters, 1)));
  const auto start = clock::now();
  while (static_cast<int>(samples_us.size()) < cfg.iters ||
         std::chrono::duration<double>(clock::now() - start).count() < cfg.seconds) {
    const auto t0 = clock::now();
    at::Tensor out = chain(x, cfg.ops, mul, add);
    const auto t1 = clock::now();
    samples_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }

  std::vector<double> sorted = samples_us;
  std::sort(sorted.begin(), sorted.end());
  std::printf("{\"ops\": %d, \"size\": %lld, \"warmup\": %d, \"iters\": %zu, \"median_us\": %.4f, "
              "\"p10_us\": %.4f, \"p90_us\": %.4f, \"check\": %.17g, \"samples_us\": [",
              cfg.ops, static_cast<long long>(cfg.size), cfg.warmup, samples_us.size(),
              percentile(sorted, 0.5), percentile(sorted, 0.1), percentile(sorted, 0.9), check);
  for (size_t i = 0; i < samples_us.size(); ++i) std::printf(i ? ", %.4f" : "%.4f", samples_us[i]);
  std::printf("]}\n");
  return 0;
}
