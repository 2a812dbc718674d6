// Small kernels whose SASS the CPU tests analyse: straight-line global memory, a shared-memory
// loop with branches, a register-tiled matrix product (many LDS/LDG/STS near FFMAs), and lanes of
// a warp that talk through shared and global memory.

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

// One warp per block, whose lanes talk through memory: a volatile warp-synchronous reduction in
// shared memory (plain STS/LDS on sm_90) and a neighbour's value through global memory after
// __syncwarp() (a NOP). Each `vs[t + d]` reads what lane t + d stored, at an address that for
// lane t itself is disjoint from its own store (the same registers, another offset).
extern "C" __global__ void warp_sums(const float* __restrict__ x, float* __restrict__ y, float* partial) {
    __shared__ float s[64];
    volatile float* vs = s;
    int t = threadIdx.x, i = blockIdx.x * 32 + t;
    vs[t] = x[i];
    vs[t + 32] = 0.f;
    for (int d = 16; d > 0; d /= 2) vs[t] += vs[t + d];
    float v = vs[t];
    partial[2 * i] = v;
    __syncwarp();
    y[i] = t < 31 ? v - partial[2 * i + 2] : v;
}
