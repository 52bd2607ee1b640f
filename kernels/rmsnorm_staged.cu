// The staged, persistent build of rmsnorm_kernel (STAGED=1). Compiled after rmsnorm_common.cuh
// (kernels/rmsnorm.py kernel_source joins the two).
//
// A grid of at most a few CTAs per multiprocessor walks the row groups; each CTA holds its threads' part
// of the weight in registers once, and copies the next group's rows global -> shared memory with
// cp.async while it normalizes the current one (two stages in dynamic shared memory:
// 2 x RPB x (1 + FUSED_ADD) x the row's vector part, sized by the launch).

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

RMSNORM_KERNEL_SIGNATURE {
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
    T* rr = res + row_offset(group, in_group, res_so, res_si);  // read and written by the fused add only
#if FUSED_ADD
    VecT* const sr = sx + nvec;
    T* dst = xr;
#else
    T* dst = out + row_offset(group, in_group, out_so, out_si);
#endif
    const T xt = has_tail ? xr[tail_col] : (T)0;
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
    const T rt = FUSED_ADD && has_tail ? rr[tail_col] : (T)0;
    float ft;
    const float s = row_inv_rms(ss, xt, rt, has_tail, rr + tail_col, ft, sub, lane, hidden, eps);
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
