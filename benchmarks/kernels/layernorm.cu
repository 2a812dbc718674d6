// Row layer normalization, fp32, y = (x - mean) / sqrt(var + eps) * w + b; one 256-thread block
// per row, n a multiple of 1024 and at most 8192. Stand-in for polytile's CUDA layernorm.
#define THREADS 256
#define MAX_VEC 8

__device__ float block_sum(float v, float* scratch) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[lane % (THREADS / 32)];
    for (int o = THREADS / 64; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    return v;
}

extern "C" __global__ void __launch_bounds__(THREADS) layernorm_f32(const float* __restrict__ x,
                                                                    const float* __restrict__ w,
                                                                    const float* __restrict__ b,
                                                                    float* __restrict__ y, int n, float eps) {
    __shared__ float scratch[THREADS / 32];
    const float4* row = reinterpret_cast<const float4*>(x + (size_t)blockIdx.x * n);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    const float4* b4 = reinterpret_cast<const float4*>(b);
    float4* out = reinterpret_cast<float4*>(y + (size_t)blockIdx.x * n);
    int vecs = n / (4 * THREADS);
    float4 v[MAX_VEC];
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < MAX_VEC; ++i)
        if (i < vecs) {
            v[i] = row[i * THREADS + threadIdx.x];
            s += v[i].x + v[i].y + v[i].z + v[i].w;
        }
    float mean = block_sum(s, scratch) / n;
    float q = 0.f;
#pragma unroll
    for (int i = 0; i < MAX_VEC; ++i)
        if (i < vecs) {
            v[i] = make_float4(v[i].x - mean, v[i].y - mean, v[i].z - mean, v[i].w - mean);
            q += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
        }
    float rstd = rsqrtf(block_sum(q, scratch) / n + eps);
#pragma unroll
    for (int i = 0; i < MAX_VEC; ++i)
        if (i < vecs) {
            int j = i * THREADS + threadIdx.x;
            float4 wv = w4[j], bv = b4[j];
            out[j] = make_float4(v[i].x * rstd * wv.x + bv.x, v[i].y * rstd * wv.y + bv.y,
                                 v[i].z * rstd * wv.z + bv.z, v[i].w * rstd * wv.w + bv.w);
        }
}
