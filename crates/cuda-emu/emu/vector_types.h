// CUDA's built-in vector types, with the device's alignments (a misaligned 16-byte vector load
// is a fault on a GPU; here the alignment at least keeps the types' sizes and layouts equal).
#pragma once

#define LMI_EMU_VEC1(T, N, A)                         \
    struct alignas(A) N##1 {                          \
        T x;                                          \
    };                                                \
    inline N##1 make_##N##1(T x) { return N##1{x}; }
#define LMI_EMU_VEC2(T, N, A)                                    \
    struct alignas(A) N##2 {                                     \
        T x, y;                                                  \
    };                                                           \
    inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define LMI_EMU_VEC3(T, N)                                                \
    struct N##3 {                                                         \
        T x, y, z;                                                        \
    };                                                                    \
    inline N##3 make_##N##3(T x, T y, T z) { return N##3{x, y, z}; }
#define LMI_EMU_VEC4(T, N, A)                                                         \
    struct alignas(A) N##4 {                                                          \
        T x, y, z, w;                                                                 \
    };                                                                                \
    inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }

LMI_EMU_VEC1(char, char, 1)
LMI_EMU_VEC2(char, char, 2)
LMI_EMU_VEC4(char, char, 4)
LMI_EMU_VEC1(unsigned char, uchar, 1)
LMI_EMU_VEC2(unsigned char, uchar, 2)
LMI_EMU_VEC4(unsigned char, uchar, 4)
LMI_EMU_VEC1(short, short, 2)
LMI_EMU_VEC2(short, short, 4)
LMI_EMU_VEC4(short, short, 8)
LMI_EMU_VEC1(unsigned short, ushort, 2)
LMI_EMU_VEC2(unsigned short, ushort, 4)
LMI_EMU_VEC4(unsigned short, ushort, 8)
LMI_EMU_VEC1(int, int, 4)
LMI_EMU_VEC2(int, int, 8)
LMI_EMU_VEC3(int, int)
LMI_EMU_VEC4(int, int, 16)
LMI_EMU_VEC1(unsigned, uint, 4)
LMI_EMU_VEC2(unsigned, uint, 8)
LMI_EMU_VEC3(unsigned, uint)
LMI_EMU_VEC4(unsigned, uint, 16)
LMI_EMU_VEC1(long long, longlong, 8)
LMI_EMU_VEC2(long long, longlong, 16)
LMI_EMU_VEC1(unsigned long long, ulonglong, 8)
LMI_EMU_VEC2(unsigned long long, ulonglong, 16)
LMI_EMU_VEC1(float, float, 4)
LMI_EMU_VEC2(float, float, 8)
LMI_EMU_VEC3(float, float)
LMI_EMU_VEC4(float, float, 16)
LMI_EMU_VEC1(double, double, 8)
LMI_EMU_VEC2(double, double, 16)

#undef LMI_EMU_VEC1
#undef LMI_EMU_VEC2
#undef LMI_EMU_VEC3
#undef LMI_EMU_VEC4

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

static_assert(sizeof(float4) == 16 && alignof(float4) == 16, "float4 layout");
static_assert(sizeof(uint2) == 8 && alignof(uint2) == 8, "uint2 layout");
static_assert(sizeof(double2) == 16 && alignof(double2) == 16, "double2 layout");
static_assert(sizeof(uint3) == 12 && sizeof(dim3) == 12, "uint3/dim3 layout");
