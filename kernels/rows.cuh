// Loops over a matrix of rows without a division or modulo per element: rows in blockIdx.y,
// columns in blockIdx.x · blockDim.x + threadIdx.x, both grid-stride (any grid covers every
// element; the host picks one, `rows_cols` in engine-cuda/src/backend.rs). The row index is 64-bit and
// offsets are formed once per row; the column index is 32-bit, which the host guarantees fits:
// width + gridDim.x · blockDim.x < 2^32.
#pragma once

// Rows r of `width` values while r · width < n (n values in all).
#define FOR_ROWS(r, width, n) \
    for (unsigned long long r = blockIdx.y; r * (width) < (n); r += gridDim.y)

// Columns c < width of the current row.
#define FOR_COLS(c, width)                                                \
    for (unsigned c = blockIdx.x * blockDim.x + threadIdx.x; c < (width); \
         c += gridDim.x * blockDim.x)
