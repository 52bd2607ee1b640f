// Fused RMSNorm and fused residual-add + RMSNorm for one storage dtype, fp32 arithmetic.
//
// Compile-time parameters, passed as -D options by kernels/rmsnorm.py (one build per set):
//   DTYPE_ID   0 = fp32, 1 = fp16, 2 = bf16 (storage type; loads, sums and scaling run in fp32)
//   VEC        elements per vector access: VEC * sizeof(T) bytes, 16 where pointers and row strides allow
//   TPR        threads per row: a power of two below 32, or a multiple of 32 up to 1024
//   RPB        rows per block (TPR * RPB is a multiple of 32 and at most 1024)
//   ITERS      vectors each thread holds in registers (ITERS * TPR * VEC >= the vector part of a row)
//   FUSED_ADD  0: out = norm(x) * w.  1: residual = x + residual; x = norm(residual) * w (in place)
//   NEG_DROP_EPS, NEG_SKIP_LAST  negative-control builds: eps left out / last column never written.
//     Validation must fail with either; they are never used outside kernels/validate.py.
//
// Rounding (vLLM csrc/layernorm_kernels.cu): the sum x + residual is rounded to T, stored as the new
// residual, and the variance is taken from that rounded value; norm(x) = T(x * rsqrt(mean(x^2) + eps))
// is rounded to T before the multiply by the weight, and the product is rounded to T once more.
//
// One global read of each row: x (and residual) are loaded once into registers, reduced with warp
// shuffles (plus one shared-memory step when a row spans several warps), scaled and stored.

#if DTYPE_ID == 0
typedef float T;
__device__ __forceinline__ float to_f(T v) { return v; }
__device__ __forceinline__ T from_f(float f) { return f; }
#elif DTYPE_ID == 1
typedef unsigned short T;
__device__ __forceinline__ float to_f(T v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
  return f;
}
__device__ __forceinline__ T from_f(float f) {
  T v;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v) : "f"(f));
  return v;
}
#elif DTYPE_ID == 2
typedef unsigned short T;
__device__ __forceinline__ float to_f(T v) { return __uint_as_float(((unsigned int)v) << 16); }
__device__ __forceinline__ T from_f(float f) {
  T v;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(v) : "f"(f));
  return v;
}
#else
#error "DTYPE_ID must be 0 (fp32), 1 (fp16) or 2 (bf16)"
#endif

struct alignas(VEC * sizeof(T)) VecT {
  T v[VEC];
};

#define BLOCK_THREADS (TPR * RPB)
#define WARP_SPAN (TPR < 32 ? TPR : 32)

// Sum over the TPR threads of one row; every thread of the row gets the total.
__device__ __forceinline__ float row_sum(float ss, int sub, int lane) {
#pragma unroll
  for (int o = WARP_SPAN / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
#if TPR > 32
  __shared__ float part[RPB][TPR / 32];
  if ((threadIdx.x & 31) == 0) part[sub][lane >> 5] = ss;
  __syncthreads();
  ss = 0.f;
#pragma unroll
  for (int w = 0; w < TPR / 32; ++w) ss += part[sub][w];
#endif
  return ss;
}

// Normalized, weighted output element with vLLM's two roundings.
__device__ __forceinline__ T scale_one(float v, float s, T w) {
  return from_f(to_f(from_f(v * s)) * to_f(w));
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
rmsnorm_kernel(T* __restrict__ out, const long long out_stride,
               T* __restrict__ x, const long long x_stride,
               T* __restrict__ res, const long long res_stride,
               const T* __restrict__ weight, const float eps,
               const int rows, const int hidden) {
  const int lane = threadIdx.x % TPR;
  const int sub = threadIdx.x / TPR;
  const long long row = (long long)blockIdx.x * RPB + sub;
  const bool active = row < rows;
  const int nvec = hidden / VEC;
  const int tail = hidden - nvec * VEC;
  const int tail_col = nvec * VEC + lane;
  const bool has_tail = active && lane < tail;

  T* xr = x + (active ? row : 0) * x_stride;
#if FUSED_ADD
  T* rr = res + (active ? row : 0) * res_stride;
  T* dst = xr;
#else
  T* dst = out + (active ? row : 0) * out_stride;
#endif

  // Issue every load of the row before the first use.
  VecT xv[ITERS], wv[ITERS];
#if FUSED_ADD
  VecT rv[ITERS];
#endif
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int v = lane + i * TPR;
    if (active && v < nvec) {
      xv[i] = reinterpret_cast<const VecT*>(xr)[v];
      wv[i] = reinterpret_cast<const VecT*>(weight)[v];
#if FUSED_ADD
      rv[i] = reinterpret_cast<const VecT*>(rr)[v];
#endif
    }
  }
  T xt = 0, wt = 0;
#if FUSED_ADD
  T rt = 0;
#endif
  if (has_tail) {
    xt = xr[tail_col];
    wt = weight[tail_col];
#if FUSED_ADD
    rt = rr[tail_col];
#endif
  }

  float f[ITERS][VEC];
  float ft = 0.f;
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int v = lane + i * TPR;
    const bool ok = active && v < nvec;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      float a = 0.f;
      if (ok) {
        a = to_f(xv[i].v[j]);
#if FUSED_ADD
        const T z = from_f(a + to_f(rv[i].v[j]));
        rv[i].v[j] = z;
        a = to_f(z);
#endif
      }
      f[i][j] = a;
      ss += a * a;
    }
#if FUSED_ADD
    if (ok) reinterpret_cast<VecT*>(rr)[v] = rv[i];
#endif
  }
  if (has_tail) {
    ft = to_f(xt);
#if FUSED_ADD
    const T z = from_f(ft + to_f(rt));
    rr[tail_col] = z;
    ft = to_f(z);
#endif
    ss += ft * ft;
  }

  ss = row_sum(ss, sub, lane);
#ifdef NEG_DROP_EPS
  const float s = rsqrtf(ss / (float)hidden);
#else
  const float s = rsqrtf(ss / (float)hidden + eps);
#endif

#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int v = lane + i * TPR;
    if (active && v < nvec) {
      VecT o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) o.v[j] = scale_one(f[i][j], s, wv[i].v[j]);
#ifdef NEG_SKIP_LAST
      if (tail == 0 && v == nvec - 1) {
        for (int j = 0; j < VEC - 1; ++j) dst[v * VEC + j] = o.v[j];
        continue;
      }
#endif
      reinterpret_cast<VecT*>(dst)[v] = o;
    }
  }
  if (has_tail) {
#ifdef NEG_SKIP_LAST
    if (tail_col != hidden - 1)
#endif
      dst[tail_col] = scale_one(ft, s, wt);
  }
}
