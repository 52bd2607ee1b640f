// Fused RMSNorm and fused residual-add + RMSNorm for one storage dtype, fp32 arithmetic: what the two
// kernel bodies share. kernels/rmsnorm.py compiles this header followed by rmsnorm.cu (the register
// build) or rmsnorm_staged.cu (the staged, persistent build), as STAGED says.
//
// Compile-time parameters, passed as -D options by kernels/rmsnorm.py (one build per set):
//   DTYPE_ID   0 = fp32, 1 = fp16, 2 = bf16 (storage type; loads, sums and scaling run in fp32)
//   VEC        elements per vector access: VEC * sizeof(T) bytes, 16 where pointers and row strides allow
//   TPR        threads per row: a power of two below 32, or a multiple of 32 up to 1024
//   RPB        rows per block (TPR * RPB is a multiple of 32 and at most 1024)
//   ITERS      vectors each thread holds in registers (ITERS * TPR * VEC >= the vector part of a row)
//   FUSED_ADD  0: out = norm(x) * w.  1: residual = x + residual; x = norm(residual) * w (in place)
//   PDL        1: programmatic dependent launch (sm_90+). The weight is loaded and every address is
//              computed before `griddepcontrol.wait` (which returns once the kernel before this one
//              on the stream has finished and its writes are visible), and `launch_dependents` lets
//              the next kernel start its own prologue right after. So the weight must not be written
//              by the kernel launched just before (model weights never are). Launched without the
//              programmatic-serialization attribute both instructions are no-ops.
//   STAGED     1: the staged, persistent build (rmsnorm_staged.cu); 0: the register build (rmsnorm.cu)
//   NEG_DROP_EPS, NEG_SKIP_LAST  negative-control builds: eps left out / last column never written.
//     Validation must fail with either; they are never used outside kernels/validate.py.
//   PLANT_NS   the planted positive control of the serving experiment (kernels/rmsnorm.py planted):
//     after its rows, thread 0 of the grid's last block spins PLANT_NS ns of GPU time (%globaltimer),
//     so a call lasts about PLANT_NS longer at any row count (the last block is dispatched last) and
//     its output is unchanged.
//
// Rounding (vLLM csrc/layernorm_kernels.cu): the sum x + residual is rounded to T, stored as the new
// residual, and the variance is taken from that rounded value; norm(x) = T(x * rsqrt(mean(x^2) + eps))
// is rounded to T before the multiply by the weight, and the product is rounded to T once more.
//
// Rows: row r starts at (r / inner) * outer stride + (r % inner) * inner stride of each tensor (its
// own two strides; see row_offset).

#if PDL
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_LAUNCH_DEPENDENTS() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_WAIT()
#define PDL_LAUNCH_DEPENDENTS()
#endif

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

// A vector of VEC elements. Two 16-bit elements share one 32-bit word, so that a thread holding
// 8 bf16 vectors keeps them in 32 registers, not 64 (ptxas: 213 registers for t64r2 fused add with
// one register per element).
#if DTYPE_ID != 0 && VEC % 2 == 0
#define PACK 2
#else
#define PACK 1
#endif
#if PACK == 2
typedef unsigned int W;
#else
typedef T W;
#endif
struct alignas(VEC * sizeof(T)) VecT {
  W w[VEC / PACK];
};

__device__ __forceinline__ T get_el(const VecT& v, int j) {
#if PACK == 2
  const unsigned int word = v.w[j >> 1];
  return (T)((j & 1) ? (word >> 16) : (word & 0xffffu));
#else
  return v.w[j];
#endif
}

__device__ __forceinline__ void set_el(VecT& v, int j, T e) {
#if PACK == 2
  const unsigned int word = v.w[j >> 1];
  v.w[j >> 1] = (j & 1) ? ((word & 0xffffu) | ((unsigned int)e << 16))
                        : ((word & 0xffff0000u) | (unsigned int)e);
#else
  v.w[j] = e;
#endif
}

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
#if STAGED
  __syncthreads();  // the persistent loop writes part again for its next row group
#endif
#endif
  return ss;
}

// Normalized, weighted output element with vLLM's two roundings.
__device__ __forceinline__ T scale_one(float v, float s, T w) {
  return from_f(to_f(from_f(v * s)) * to_f(w));
}

// 1 / sqrt(mean of squares + eps) of a row whose squares sum to ss.
__device__ __forceinline__ float inv_rms(float ss, int hidden, float eps) {
#ifdef NEG_DROP_EPS
  return rsqrtf(ss / (float)hidden);
#else
  return rsqrtf(ss / (float)hidden + eps);
#endif
}

// The row's 1 / rms: this thread's sum of squares `ss` over its vectors plus its tail element (has_tail:
// x's `xt`, or for the fused add its rounded sum with the residual's `rt`, which is stored at `rr_tail`
// as the new residual), summed over the row's threads. `ft` gets the tail element's value in fp32.
__device__ __forceinline__ float row_inv_rms(float ss, T xt, T rt, bool has_tail, T* rr_tail, float& ft,
                                             int sub, int lane, int hidden, float eps) {
  ft = 0.f;
  if (has_tail) {
    ft = to_f(xt);
#if FUSED_ADD
    const T z = from_f(ft + to_f(rt));
    *rr_tail = z;
    ft = to_f(z);
#endif
    ss += ft * ft;
  }
  return inv_rms(row_sum(ss, sub, lane), hidden, eps);
}

// Store output vector v of a row (the negative control leaves the row's last column unwritten).
__device__ __forceinline__ void store_vec(T* dst, int v, int nvec, int tail, const VecT& o) {
#ifdef NEG_SKIP_LAST
  if (tail == 0 && v == nvec - 1) {
    for (int j = 0; j < VEC - 1; ++j) dst[v * VEC + j] = get_el(o, j);
    return;
  }
#endif
  reinterpret_cast<VecT*>(dst)[v] = o;
}

// Store the scalar tail element at column col.
__device__ __forceinline__ void store_tail(T* dst, int col, int hidden, T o) {
#ifdef NEG_SKIP_LAST
  if (col == hidden - 1) return;
#endif
  dst[col] = o;
}

// The planted positive control: thread 0 of the grid's last block spins PLANT_NS ns of GPU time.
__device__ __forceinline__ void plant_delay() {
#ifdef PLANT_NS
  if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < (unsigned long long)PLANT_NS);
  }
#endif
}

// Element offset of row `row` in a tensor whose rows step by `inner_stride` within a group of `inner`
// rows and by `outer_stride` from one group to the next (a [tokens, heads, width] view of a wider buffer,
// as vLLM's q/k head norms pass it; inner = 1 for one stride between rows).
__device__ __forceinline__ long long row_offset(long long group, long long in_group, long long outer_stride,
                                                long long inner_stride) {
  return group * outer_stride + in_group * inner_stride;
}

// The signature both bodies define (kernels/launch.py ARG_TYPES passes the arguments in this order).
#define RMSNORM_KERNEL_SIGNATURE                                                              \
  extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)                                 \
  rmsnorm_kernel(T* __restrict__ out, const long long out_so, const long long out_si,        \
                 T* __restrict__ x, const long long x_so, const long long x_si,              \
                 T* __restrict__ res, const long long res_so, const long long res_si,        \
                 const T* __restrict__ weight, const float eps,                              \
                 const int rows, const int inner, const int hidden)
