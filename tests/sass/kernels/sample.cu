// Small kernels whose SASS the CPU tests analyse: straight-line global memory, a shared-memory
// loop with branches, and a register-tiled matrix product (many LDS/LDG/STS near FFMAs).

extern "C" __global__ void saxpy(int n, float a, const float* __restrict__ x, float* __restrict__ y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void stencil(const float* __restrict__ x, float* __restrict__ y, int n) {
    __shared__ float tile[258];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x + 1] = i < n ? x[i] : 0.f;
    if (threadIdx.x == 0) tile[0] = i > 0 ? x[i - 1] : 0.f;
    if (threadIdx.x == blockDim.x - 1) tile[threadIdx.x + 2] = i + 1 < n ? x[i + 1] : 0.f;
    __syncthreads();
    if (i < n) y[i] = 0.25f * tile[threadIdx.x] + 0.5f * tile[threadIdx.x + 1] + 0.25f * tile[threadIdx.x + 2];
}

#define TILE 32
#define WORK 4
extern "C" __global__ void __launch_bounds__(256) matmul(const float* __restrict__ a, const float* __restrict__ b,
                                                          float* __restrict__ c, int m, int n, int k) {
    __shared__ float as[TILE][TILE + 1];
    __shared__ float bs[TILE][TILE + 1];
    int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE;        // 32 x 8 threads, 4 rows each
    int row0 = blockIdx.y * TILE + ty * WORK, col = blockIdx.x * TILE + tx;
    float acc[WORK] = {0.f, 0.f, 0.f, 0.f};
    for (int k0 = 0; k0 < k; k0 += TILE) {
        for (int r = 0; r < WORK; ++r) {
            int ar = row0 + r, ac = k0 + tx, br = k0 + ty * WORK + r;
            as[ty * WORK + r][tx] = ar < m && ac < k ? a[ar * k + ac] : 0.f;
            bs[ty * WORK + r][tx] = br < k && col < n ? b[br * n + col] : 0.f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < TILE; ++kk) {
            float bv = bs[kk][tx];
            for (int r = 0; r < WORK; ++r) acc[r] += as[ty * WORK + r][kk] * bv;
        }
        __syncthreads();
    }
    for (int r = 0; r < WORK; ++r)
        if (row0 + r < m && col < n) c[(row0 + r) * n + col] = acc[r];
}
