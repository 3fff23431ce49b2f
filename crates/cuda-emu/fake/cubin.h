// What the fake driver reads from a CUBIN (the ELF image NVRTC writes, as cuModuleLoadData
// takes it): the target architecture, and for each kernel its parameters' offsets and sizes,
// registers per thread, __launch_bounds__, static shared memory and stack frame, from the
// symbol table and the .nv.info attributes the real driver reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fake {

struct CubinParam {
    uint32_t offset;  // in the parameter buffer
    uint32_t size;
};

struct CubinKernel {
    std::string name;
    std::vector<CubinParam> params;  // by ordinal
    uint32_t param_bytes = 0;        // the parameter buffer's size
    uint32_t registers = 0;          // per thread
    uint32_t max_threads = 0;        // __launch_bounds__ (0: none)
    uint32_t static_shared = 0;      // bytes, without the 1 KiB the system reserves
    uint32_t frame_bytes = 0;        // per-thread stack frame
};

struct Cubin {
    uint32_t sm = 0;  // 90 for sm_90
    size_t image_bytes = 0;
    std::vector<CubinKernel> kernels;
};

// Parses the image at `image` (its size is read from its own headers). False with `error` set
// when it is not a CUDA ELF image.
bool parse_cubin(const void* image, Cubin* out, std::string* error);

}  // namespace fake
