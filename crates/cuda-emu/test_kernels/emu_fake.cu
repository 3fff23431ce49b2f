// Kernels for the fake driver's tests (tests/fake_driver.rs): NVRTC compiles them for the
// fake device, whose launches run the emulator's build of the same kernels.
#include "common.cuh"

// At most 128 threads per block (ptxas records the bound; the driver enforces it).
extern "C" __global__ void __launch_bounds__(128) fake_bounded(float* y) {
    y[threadIdx.x] = (float)threadIdx.x;
}

// 32 KiB of static shared memory: what a block may add dynamically is 227 KiB minus this.
extern "C" __global__ void fake_static_shared(float* y) {
    __shared__ float s[8192];
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    y[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}

// Parameters of every width, each at the offset its alignment gives it.
extern "C" __global__ void fake_params(double* y, unsigned a, double b, float c,
                                       unsigned long long d, int e, const float* f) {
    y[0] = a;
    y[1] = b;
    y[2] = c;
    y[3] = (double)d;
    y[4] = e;
    y[5] = f[0];
}
