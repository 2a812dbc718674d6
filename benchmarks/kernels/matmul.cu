// C = A * B, fp32, row-major, M, N, K multiples of 64. A 64x64 block tile per 256 threads,
// 4x4 outputs per thread, 16-wide K steps through shared memory with float4 global loads.
// Stand-in for polytile's CUDA matmul until the backend produces one.
#define BM 64
#define BN 64
#define BK 16

extern "C" __global__ void __launch_bounds__(256) matmul_f32(const float* __restrict__ a, const float* __restrict__ b,
                                                              float* __restrict__ c, int m, int n, int k) {
    __shared__ float as[BK][BM + 4];
    __shared__ float bs[BK][BN + 4];
    int tid = threadIdx.x;
    int tx = tid % 16, ty = tid / 16;
    const float* a_block = a + blockIdx.y * BM * k;
    const float* b_block = b + blockIdx.x * BN;
    float acc[4][4] = {};
    int a_row = tid / 4, a_col = (tid % 4) * 4;      // 64 rows x 16 cols of A, one float4 each
    int b_row = tid / 16, b_col = (tid % 16) * 4;    // 16 rows x 64 cols of B, one float4 each
    for (int k0 = 0; k0 < k; k0 += BK) {
        float4 av = *reinterpret_cast<const float4*>(a_block + a_row * k + k0 + a_col);
        float4 bv = *reinterpret_cast<const float4*>(b_block + (k0 + b_row) * n + b_col);
        as[a_col + 0][a_row] = av.x;
        as[a_col + 1][a_row] = av.y;
        as[a_col + 2][a_row] = av.z;
        as[a_col + 3][a_row] = av.w;
        *reinterpret_cast<float4*>(&bs[b_row][b_col]) = bv;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float4 x = *reinterpret_cast<const float4*>(&as[kk][ty * 4]);
            float4 y = *reinterpret_cast<const float4*>(&bs[kk][tx * 4]);
            float xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += xs[i] * ys[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; ++i) {
        float4 out = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
        *reinterpret_cast<float4*>(c + (blockIdx.y * BM + ty * 4 + i) * n + blockIdx.x * BN + tx * 4) = out;
    }
}
