// Self-test kernels of the emulator: atomics.
#include "common.cuh"

// Every thread of every block adds into the same counters.
extern "C" __global__ void emu_atomics(int* i, unsigned* u, unsigned long long* ull, float* f, double* d) {
    const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(&i[0], 1);
    atomicSub(&i[1], 2);
    atomicMax(&i[2], (int)t);
    atomicMin(&i[3], -(int)t);
    atomicAdd(&u[0], 3u);
    atomicOr(&u[1], 1u << (t % 32));
    atomicAnd(&u[2], ~(1u << (t % 16)));
    atomicXor(&u[3], 1u);
    atomicMax(&u[4], t);
    atomicMin(&u[5], t + 10);
    atomicAdd(&ull[0], 1ull << 33);
    atomicMax(&ull[1], (unsigned long long)t);
    atomicAdd(&f[0], 0.5f);
    atomicAdd(&d[0], 0.25);
    // a CAS-based increment
    unsigned old = u[6], seen;
    do {
        seen = old;
        old = atomicCAS(&u[6], seen, seen + 1);
    } while (old != seen);
    atomicExch(&u[7], 42u);
}
