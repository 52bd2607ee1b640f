// Fused RMSNorm and fused residual-add + RMSNorm for one storage dtype, fp32 arithmetic.
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
//   STAGED     1: the staged, persistent build (rmsnorm_kernel below its #if STAGED): a grid of at most a
//              few CTAs per multiprocessor walks the row groups; each CTA holds its threads' part of the
//              weight in registers once, and copies the next group's rows global -> shared memory with
//              cp.async while it normalizes the current one (two stages in dynamic shared memory:
//              2 x RPB x (1 + FUSED_ADD) x the row's vector part, sized by the launch).
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
//
// One global read of each row: x (and residual) are loaded once into registers, ITERS 16-byte vectors
// per thread all issued before the first use, reduced with warp shuffles (plus one shared-memory step
// when a row spans several warps), scaled and stored.

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

#if !STAGED
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
rmsnorm_kernel(T* __restrict__ out, const long long out_so, const long long out_si,
               T* __restrict__ x, const long long x_so, const long long x_si,
               T* __restrict__ res, const long long res_so, const long long res_si,
               const T* __restrict__ weight, const float eps,
               const int rows, const int inner, const int hidden) {
  const int lane = threadIdx.x % TPR;
  const int sub = threadIdx.x / TPR;
  const long long row = (long long)blockIdx.x * RPB + sub;
  const bool active = row < rows;
  const long long r = active ? row : 0;
  const long long group = r / inner;
  const long long in_group = r - group * inner;
  const int nvec = hidden / VEC;
  const int tail = hidden - nvec * VEC;
  const int tail_col = nvec * VEC + lane;
  const bool has_tail = active && lane < tail;

  T* xr = x + row_offset(group, in_group, x_so, x_si);
#if FUSED_ADD
  T* rr = res + row_offset(group, in_group, res_so, res_si);
  T* dst = xr;
#else
  T* dst = out + row_offset(group, in_group, out_so, out_si);
#endif

  // Issue every load of the row before the first use: the weight first (before PDL_WAIT: it is not
  // written by the kernel before this one), then x and the residual.
  VecT xv[ITERS], wv[ITERS];
#if FUSED_ADD
  VecT rv[ITERS];
#endif
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int v = lane + i * TPR;
    if (active && v < nvec) wv[i] = reinterpret_cast<const VecT*>(weight)[v];
  }
  T xt = 0, wt = 0;
#if FUSED_ADD
  T rt = 0;
#endif
  if (has_tail) wt = weight[tail_col];
  PDL_WAIT();
  PDL_LAUNCH_DEPENDENTS();
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int v = lane + i * TPR;
    if (active && v < nvec) {
      xv[i] = reinterpret_cast<const VecT*>(xr)[v];
#if FUSED_ADD
      rv[i] = reinterpret_cast<const VecT*>(rr)[v];
#endif
    }
  }
  if (has_tail) {
    xt = xr[tail_col];
#if FUSED_ADD
    rt = rr[tail_col];
#endif
  }

  // The row stays in registers as T (the rounded sum for the fused add): converted again to fp32 for
  // the scaling, so a thread holds no fp32 copy of its ITERS vectors (8 bf16 vectors per thread
  // used 255 registers with one).
  float ft = 0.f;
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int v = lane + i * TPR;
    if (active && v < nvec) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
#if FUSED_ADD
        const T z = from_f(to_f(get_el(xv[i], j)) + to_f(get_el(rv[i], j)));
        set_el(rv[i], j, z);
        const float a = to_f(z);
#else
        const float a = to_f(get_el(xv[i], j));
#endif
        ss += a * a;
      }
#if FUSED_ADD
      reinterpret_cast<VecT*>(rr)[v] = rv[i];
#endif
    }
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
  const float s = inv_rms(ss, hidden, eps);

#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int v = lane + i * TPR;
    if (active && v < nvec) {
      VecT o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
#if FUSED_ADD
        set_el(o, j, scale_one(to_f(get_el(rv[i], j)), s, get_el(wv[i], j)));
#else
        set_el(o, j, scale_one(to_f(get_el(xv[i], j)), s, get_el(wv[i], j)));
#endif
      }
      store_vec(dst, v, nvec, tail, o);
    }
  }
  if (has_tail) store_tail(dst, tail_col, hidden, scale_one(ft, s, wt));
  plant_delay();
}
#endif  // STAGED

#if STAGED
// Copy one vector global -> shared without passing through registers (cp.async; the thread that
// issues it is the only one that reads it back, after cp.async.wait_group). 16-byte vectors bypass L1
// (.cg); 4- and 8-byte ones go through it (.ca, the only form for them); a 2-byte vector is copied.
__device__ __forceinline__ void stage_copy(VecT* dst, const VecT* src) {
  if constexpr (sizeof(VecT) == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                 :: "r"((unsigned int)__cvta_generic_to_shared(dst)), "l"(__cvta_generic_to_global(src))
                 : "memory");
  } else if constexpr (sizeof(VecT) >= 4) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;"
                 :: "r"((unsigned int)__cvta_generic_to_shared(dst)), "l"(__cvta_generic_to_global(src)),
                    "n"((int)sizeof(VecT))
                 : "memory");
  } else {
    *dst = *src;
  }
}

#define STAGE_TENSORS (1 + FUSED_ADD)  // x, and the residual for the fused add

// Issue the copies of this thread's vectors of row `row` (x, and the residual) into stage `st`.
__device__ __forceinline__ void stage_row(VecT* st, long long row, int rows, int inner, int nvec, int lane,
                                          const T* x, long long x_so, long long x_si,
                                          const T* res, long long res_so, long long res_si) {
  if (row >= rows) return;
  const long long group = row / inner;
  const VecT* xr = reinterpret_cast<const VecT*>(x + row_offset(group, row - group * inner, x_so, x_si));
#if FUSED_ADD
  const VecT* rr = reinterpret_cast<const VecT*>(res + row_offset(group, row - group * inner, res_so, res_si));
#endif
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int v = lane + i * TPR;
    if (v < nvec) {
      stage_copy(st + v, xr + v);
#if FUSED_ADD
      stage_copy(st + nvec + v, rr + v);
#endif
    }
  }
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
rmsnorm_kernel(T* __restrict__ out, const long long out_so, const long long out_si,
               T* __restrict__ x, const long long x_so, const long long x_si,
               T* __restrict__ res, const long long res_so, const long long res_si,
               const T* __restrict__ weight, const float eps,
               const int rows, const int inner, const int hidden) {
  extern __shared__ __align__(16) unsigned char stage_raw[];
  VecT* const stages = reinterpret_cast<VecT*>(stage_raw);
  const int lane = threadIdx.x % TPR;
  const int sub = threadIdx.x / TPR;
  const int nvec = hidden / VEC;
  const int tail = hidden - nvec * VEC;
  const int tail_col = nvec * VEC + lane;
  const long long groups = ((long long)rows + RPB - 1) / RPB;
  // this thread's row in stage st: stages + (st * RPB + sub) * STAGE_TENSORS * nvec (x, then residual)
  const long long stage_step = (long long)RPB * STAGE_TENSORS * nvec;
  VecT* const mine = stages + (long long)sub * STAGE_TENSORS * nvec;

  // The weight once per CTA, before PDL_WAIT (not written by the kernel before this one).
  VecT wv[ITERS];
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int v = lane + i * TPR;
    if (v < nvec) wv[i] = reinterpret_cast<const VecT*>(weight)[v];
  }
  const T wt = lane < tail ? weight[tail_col] : (T)0;
  PDL_WAIT();
  PDL_LAUNCH_DEPENDENTS();

  long long g = blockIdx.x;
  stage_row(mine, g * RPB + sub, rows, inner, nvec, lane, x, x_so, x_si, res, res_so, res_si);
  asm volatile("cp.async.commit_group;" ::: "memory");
  for (int st = 0; g < groups; g += gridDim.x, st ^= 1) {
    // the next group's rows stream in while this one is normalized (one commit group per iteration,
    // empty at the last, so that wait_group 1 always means "the current group has landed")
    if (g + gridDim.x < groups)
      stage_row(mine + (st ^ 1) * stage_step, (g + gridDim.x) * RPB + sub, rows, inner, nvec, lane,
                x, x_so, x_si, res, res_so, res_si);
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 1;" ::: "memory");

    const long long row = g * RPB + sub;
    const bool active = row < rows;
    const long long r = active ? row : 0;
    const long long group = r / inner;
    const long long in_group = r - group * inner;
    const bool has_tail = active && lane < tail;
    VecT* const sx = mine + st * stage_step;
    T* xr = x + row_offset(group, in_group, x_so, x_si);
#if FUSED_ADD
    VecT* const sr = sx + nvec;
    T* rr = res + row_offset(group, in_group, res_so, res_si);
    T* dst = xr;
#else
    T* dst = out + row_offset(group, in_group, out_so, out_si);
#endif
    float ft = has_tail ? to_f(xr[tail_col]) : 0.f;
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int v = lane + i * TPR;
      if (active && v < nvec) {
#if FUSED_ADD
        // the rounded sum replaces x in the stage and is written out as the new residual
        VecT a = sx[v];
        const VecT b = sr[v];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const T z = from_f(to_f(get_el(a, j)) + to_f(get_el(b, j)));
          set_el(a, j, z);
          ss += to_f(z) * to_f(z);
        }
        sx[v] = a;
        reinterpret_cast<VecT*>(rr)[v] = a;
#else
        const VecT a = sx[v];
#pragma unroll
        for (int j = 0; j < VEC; ++j) ss += to_f(get_el(a, j)) * to_f(get_el(a, j));
#endif
      }
    }
    if (has_tail) {
#if FUSED_ADD
      const T z = from_f(ft + to_f(rr[tail_col]));
      rr[tail_col] = z;
      ft = to_f(z);
#endif
      ss += ft * ft;
    }
    ss = row_sum(ss, sub, lane);
    const float s = inv_rms(ss, hidden, eps);
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int v = lane + i * TPR;
      if (active && v < nvec) {
        const VecT a = sx[v];
        VecT o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) set_el(o, j, scale_one(to_f(get_el(a, j)), s, get_el(wv[i], j)));
        store_vec(dst, v, nvec, tail, o);
      }
    }
    if (has_tail) store_tail(dst, tail_col, hidden, scale_one(ft, s, wt));
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  plant_delay();
}
#endif  // STAGED
