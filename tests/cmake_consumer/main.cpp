// consumer ARTIFACT INPUTS OUTPUT: load an exported artifact with the installed graphex package,
// run it on INPUTS (safetensors, "0", "1", ...) and write the tensor leaves of the result to OUTPUT.
#include <graphex/graphex.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: consumer ARTIFACT INPUTS OUTPUT\n";
    return 2;
  }
  graphex::Module module = graphex::Module::load(argv[1]);
  std::map<std::string, at::Tensor> named = graphex::deploy::loadSafetensors(argv[2]);
  std::vector<c10::IValue> args;
  for (size_t i = 0; i < module.numArguments(); ++i) args.emplace_back(named.at(std::to_string(i)).clone());
  std::vector<c10::IValue> result = module.run(args);
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < result.size(); ++i)
    if (result[i].isTensor()) out.emplace(std::to_string(i), result[i].toTensor());
  graphex::deploy::saveSafetensors(argv[3], out);
  std::cout << "ran " << argv[1] << ": " << out.size() << " tensors\n";
  return 0;
}
