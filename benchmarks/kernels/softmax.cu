// Row softmax, fp32, one 256-thread block per row, n a multiple of 1024 and at most 8192.
// Stand-in for polytile's CUDA softmax until the backend produces one.
#define THREADS 256
#define MAX_VEC 8

__device__ float block_reduce(float v, bool is_max, float* scratch) {
    for (int o = 16; o > 0; o /= 2) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[lane % (THREADS / 32)];
    for (int o = THREADS / 64; o > 0; o /= 2) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    __syncthreads();
    return v;
}

extern "C" __global__ void __launch_bounds__(THREADS) softmax_f32(const float* __restrict__ x, float* __restrict__ y,
                                                                  int n) {
    __shared__ float scratch[THREADS / 32];
    const float4* row = reinterpret_cast<const float4*>(x + (size_t)blockIdx.x * n);
    float4* out = reinterpret_cast<float4*>(y + (size_t)blockIdx.x * n);
    int vecs = n / (4 * THREADS);
    float4 v[MAX_VEC];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < MAX_VEC; ++i)
        if (i < vecs) {
            v[i] = row[i * THREADS + threadIdx.x];
            m = fmaxf(m, fmaxf(fmaxf(v[i].x, v[i].y), fmaxf(v[i].z, v[i].w)));
        }
    m = block_reduce(m, true, scratch);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < MAX_VEC; ++i)
        if (i < vecs) {
            v[i] = make_float4(__expf(v[i].x - m), __expf(v[i].y - m), __expf(v[i].z - m), __expf(v[i].w - m));
            s += v[i].x + v[i].y + v[i].z + v[i].w;
        }
    float inv = 1.f / block_reduce(s, false, scratch);
#pragma unroll
    for (int i = 0; i < MAX_VEC; ++i)
        if (i < vecs) out[i * THREADS + threadIdx.x] = make_float4(v[i].x * inv, v[i].y * inv, v[i].z * inv, v[i].w * inv);
}
