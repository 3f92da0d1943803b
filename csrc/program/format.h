// The program artifact on disk: FlatBuffers, schema csrc/schema/program.fbs.
//
// Note [One typed format]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A program is one size-prefixed FlatBuffers `Program` (file identifier "GXPG", field
// format_version); the size prefix tells a truncated file from a whole one.
// Python writes it with flatc's generated builders (graphex/program/encode.py, the only encoder);
// C++ reads it in place through flatc's generated header, after `verify` has checked,
// before anything runs, that it is ours (identifier), well formed (every offset, length
// and nested table inside the buffer: flatbuffers::Verifier) and of the version this build
// reads. A truncated, corrupt, foreign or future file is a FormatError that says which.
// Why FlatBuffers: typed tables with a schema both languages generate code from, a
// verifier, reads without a parse step (Program::load walks the buffer), backward
// compatible evolution (fields only appended), and the same choice as ExecuTorch's .pte.
//
// Note [graphex owns its enums on disk]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Dtypes, devices, layouts and memory formats are graphex's enums (fb::DType, ...), not
// c10 integers, whose numbering is torch's to change. They are mapped to c10 here, in
// one place; a value this build does not know is a FormatError, never a wrong dtype.
#pragma once

#include "program_generated.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace graphex::format {

// Bump with FORMAT_VERSION in graphex/program/encode.py when the meaning of any field changes.
constexpr uint32_t kFormatVersion = 4;  // 3: a float argument of -0.0 is written (Note [A float's sign survives the
                                         // format], graphex/program/encode.py); a program of 2 may have lost it.
                                         // 4: a result leaf may be another view of a program output (OutputView)
// The oldest version this build reads: every program of 3 means what it meant (4 only added a leaf kind).
constexpr uint32_t kOldestReadableVersion = 3;
constexpr char kFileIdentifier[] = "GXPG";

// A file that is not a graphex program this build can read; the message says why.
class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Check identifier, structure and version of `bytes` (Note [One typed format]); the
// returned table points into `bytes`, which must outlive it.
const fb::Program& verify(std::string_view bytes);

c10::ScalarType toScalarType(fb::DType dtype);
fb::DType fromScalarType(c10::ScalarType dtype);  // FormatError for a dtype the format lacks
c10::Device toDevice(const fb::Device* device);
c10::Layout toLayout(fb::Layout layout);
c10::MemoryFormat toMemoryFormat(fb::MemoryFormat format);

// A constant tensor stored in the program (copied out of the buffer).
at::Tensor toTensor(const fb::Tensor& t, const std::string& what);

}  // namespace graphex::format
