// Self-test kernel of the emulator: the cost of barriers.
#include "common.cuh"

extern "C" __global__ void emu_many_syncs(float* out, unsigned rounds) {
    __shared__ float s[1024];
    float acc = 0.0f;
    for (unsigned r = 0; r < rounds; ++r) {
        s[threadIdx.x] = threadIdx.x + r;
        __syncthreads();
        acc += s[(threadIdx.x + 1) % blockDim.x];
        __syncthreads();
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
