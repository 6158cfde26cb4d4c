// libFuzzer target for the safetensors reader: any bytes must parse or throw ampgrad::Error;
// any other exception, crash or sanitizer report is a bug. Built and run by fuzz/run.sh.
#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/safetensors.h"
#include "framework/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const ampgrad::checkpoint::NamedTensors parsed = ampgrad::checkpoint::parse_safetensors(bytes, "fuzz");
    // Touch every tensor's bytes so that a wrong size shows up under ASan.
    for (const auto& [name, tensor] : parsed.tensors) (void)tensor.to_double_vector();
  } catch (const ampgrad::Error&) {
    // Rejected with a clear message: the expected outcome for bad input.
  }
  return 0;
}
