#include "deploy/module.h"

#include "deploy/safetensors.h"
#include "program/arguments.h"
#include "program/format.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace graphex {

namespace {

std::string readFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw format::FormatError("cannot open program " + path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Note [Load names every missing operator at once]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A deployed process lacks custom operators until their TORCH_LIBRARY library is loaded. Before
// building the program, every Op node is looked up; all the operators the dispatcher does not have
// are named in one error (in order of first use, each once) with the fix, so one retry is enough.
void requireOperators(const fb::Program& root, const std::string& program_path) {
  if (!root.nodes()) return;
  std::vector<std::string> missing;
  for (const fb::Node* node : *root.nodes()) {
    if (node->kind() != fb::NodeKind::Op || !node->op()) continue;
    std::string name = node->op()->str();
    std::string overload = node->overload() ? node->overload()->str() : "";
    if (overload == "default") overload.clear();
    if (c10::Dispatcher::singleton().findSchema({name, overload})) continue;
    std::string qualified = overload.empty() ? name : name + "." + overload;
    if (std::find(missing.begin(), missing.end(), qualified) == missing.end()) missing.push_back(qualified);
  }
  if (missing.empty()) return;
  std::string list;
  for (const std::string& op : missing) list += (list.empty() ? "" : ", ") + op;
  throw ProgramError(program_path + " calls " + std::to_string(missing.size()) + " operator" +
                     (missing.size() > 1 ? "s" : "") + " this process does not have: " + list +
                     ". Load the library of TORCH_LIBRARY operators that defines " +
                     (missing.size() > 1 ? "them" : "it") +
                     " first: pass --load-library path/to/lib.so to graphex-run, or link it into your program "
                     "(-Wl,--no-as-needed so that its registrations run), or dlopen it before graphex::Module::load");
}

}  // namespace

Module Module::load(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  fs::path program_path = fs::is_directory(path) ? dir / "program.gxp" : fs::path(path);
  std::string bytes = readFile(program_path.string());
  const fb::Program& root = format::verify(bytes);

  Module m;
  m.tree_ = root.tree() ? root.tree()->str() : "";
  if (!root.bindings() || root.bindings()->size() != (root.inputs() ? root.inputs()->size() : 0))
    throw format::FormatError(program_path.string() + " has no input bindings: it is a program for one compile, "
                              "not an exported artifact (write one with graphex.export)");
  bool needs_weights = false;
  for (const fb::Binding* b : *root.bindings())
    needs_weights |= b->kind() == fb::BindingKind::Parameter || b->kind() == fb::BindingKind::Buffer;
  if (needs_weights) {
    std::string weights = root.weights_file() ? root.weights_file()->str() : "weights.safetensors";
    m.weights_ = deploy::loadSafetensors((dir / weights).string());
  }

  requireOperators(root, program_path.string());
  Program program = Program::fromTable(root);
  m.binder_ = Binder::fromTable(root, program, program_path.string());  // Note [One binder]
  for (int32_t i : m.binder_.heldBindings()) {
    const fb::Binding& b = *root.bindings()->Get(i);
    if (b.kind() == fb::BindingKind::ArgumentPath)
      throw format::FormatError("program input " + std::to_string(i) + " is a tensor that argument " +
                                std::to_string(b.index()) + " holds (" + (b.name() ? b.name()->str() : "?") +
                                "): graphex::Module takes tensors as arguments; this program is a cache entry's, "
                                "not an exported artifact");
    std::string name = b.name() ? b.name()->str() : "";
    auto it = m.weights_.find(name);
    if (it == m.weights_.end())
      throw deploy::WeightsError("the weights file has no tensor '" + name + "', which program input " +
                                 std::to_string(i) + " (" + program.inputs[i].name + ") is bound to");
    // Checked once here (Note [An artifact binds its inputs by kind]); the run-time check then passes.
    std::string mismatch = describeMismatch(program.inputs[i], it->second);
    if (!mismatch.empty()) throw deploy::WeightsError("weight '" + name + "' does not match the program: " + mismatch);
    m.held_.push_back(it->second);
  }
  m.executor_ = std::make_shared<const Executor>(std::move(program));
  return m;
}

std::vector<c10::IValue> Module::run(const std::vector<c10::IValue>& args) const {
  if (args.size() != binder_.numArguments())
    throw SignatureError("graphex::Module: " + std::to_string(args.size()) + " arguments given, the program takes " +
                         std::to_string(binder_.numArguments()));
  std::vector<c10::IValue> inputs;
  try {
    inputs = binder_.bind(args, held_);
  } catch (const SignatureError& e) {
    throw SignatureError(std::string("graphex::Module: ") + e.what());
  }
  std::string broken = binder_.brokenGuard(inputs, executor_->program());  // Note [An exported program checks ...]
  if (!broken.empty())
    throw SignatureError("graphex::Module: the inputs break a shape guard the program was traced under: " + broken +
                         ". The program was exported with dynamic=True from example inputs for which it holds; "
                         "export again with examples of these shapes, or with dynamic=False");
  return binder_.results(executor_->run(std::move(inputs)), args);
}

}  // namespace graphex
