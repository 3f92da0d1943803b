// graphex's deploy API in one include: #include <graphex/graphex.h> (find_package(graphex)).
//
//   auto m = graphex::Module::load("model.graphex");            // written by graphex.export
//   std::vector<c10::IValue> out = m.run({x});                   // the flattened result
//   auto tensors = graphex::deploy::loadSafetensors("x.safetensors");
#pragma once

#include "deploy/module.h"
#include "deploy/safetensors.h"
