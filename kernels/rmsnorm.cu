// The register build of rmsnorm_kernel (STAGED=0): one row group per CTA, each row held in registers.
// Compiled after rmsnorm_common.cuh (kernels/rmsnorm.py kernel_source joins the two), which holds the
// build options, the element types, vLLM's roundings and the helpers this file shares with
// rmsnorm_staged.cu.
//
// One global read of each row: x (and residual) are loaded once into registers, ITERS 16-byte vectors
// per thread all issued before the first use, reduced with warp shuffles (plus one shared-memory step
// when a row spans several warps), scaled and stored.

RMSNORM_KERNEL_SIGNATURE {
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
  T* rr = res + row_offset(group, in_group, res_so, res_si);  // read and written by the fused add only
#if FUSED_ADD
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
  T xt = 0, wt = 0, rt = 0;
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
  float ft;
  const float s = row_inv_rms(ss, xt, rt, has_tail, rr + tail_col, ft, sub, lane, hidden, eps);

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
