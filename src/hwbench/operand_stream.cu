// The loads of a small-M GEMM main loop alone: how fast can 128 CTAs stream their W tiles and the
// shared X through a multi-stage shared-memory pipeline, by copy mechanism?
//   mode 0: cp.async 16 B per thread, commit/wait groups, __syncthreads (what s_tir emits)
//   mode 1: cp.async.bulk of one 128 B row per thread, completing on a per-stage mbarrier
//   mode 2: as 1, X multicast to both CTAs of a cluster of 2 (each CTA fetches half of X's rows)
//   mode 3: two 2D tensor copies (TMA, CUtensorMap) per stage, 128 rows x 64 columns each, from one
//           thread (dense 128-byte rows, no swizzle: the copy engine alone, not an mma layout)
// Every step each thread reads 8 x 16 B of the stage (like the fragment loads). Shape: X [128, K],
// W [N, K] fp16, CTA n streams W rows [128 n, 128 n + 128) and all of X in 128 x 64 tiles.
// Prints one JSON object per (mode, stages). Build:
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o operand_stream operand_stream.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda_check.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int kRows = 256;          // 128 rows of X + 128 rows of W per stage
#ifndef ROW_BYTES
#define ROW_BYTES 128
#endif
constexpr int kRowBytes = ROW_BYTES;  // 64 fp16 (block_k = 64) by default
constexpr int kPitch = kRowBytes + 16;  // padded row (what the GEMM rule uses)
constexpr int kChunks = kRowBytes / 16;  // 16-byte copies per row
constexpr int kStageBytes = kRows * kPitch;
constexpr int kThreads = 256;
__constant__ int kRotate;  // step offset per CTA (0: all CTAs read the same X tile at once)

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void bulk_row(void* dst, const void* src, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(kRowBytes), "r"(smem_addr(bar))
      : "memory");
}

__device__ __forceinline__ void bulk_row_multicast(void* dst, const void* src, uint64_t* bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1], %2, [%3], %4;" ::"r"(smem_addr(dst)),
      "l"(src), "r"(kRowBytes), "r"(smem_addr(bar)), "h"(mask)
      : "memory");
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;" ::: "memory");
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Source row r (0..255) of step k for CTA n: X rows first, then this CTA's W rows.
__device__ __forceinline__ const char* row_src(const char* x, const char* w, int n, int k_elems, int r, int step) {
  const int steps = k_elems * 2 / kRowBytes;
  size_t col = (size_t)((step + kRotate * n) % steps) * kRowBytes;
  if (r < 128) return x + (size_t)r * k_elems * 2 + col;
  return w + ((size_t)n * 128 + (r - 128)) * k_elems * 2 + col;
}

__device__ __forceinline__ float consume(const char* stage) {
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    int idx = j * kThreads + threadIdx.x;  // 2048 16-byte chunks of the stage
    const float4 v = *reinterpret_cast<const float4*>(stage + (idx >> 3) * kPitch + (idx & 7) * 16);
    acc += v.x + v.w;
  }
  return acc;
}

__device__ __forceinline__ void tma_2d(void* dst, const CUtensorMap* map, int col, int row, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_addr(dst)),
      "l"(map), "r"(col), "r"(row), "r"(smem_addr(bar))
      : "memory");
}

template <int kMode>
__global__ void __launch_bounds__(kThreads) stream_kernel(const char* __restrict__ x, const char* __restrict__ w,
                                                          int k_elems, int stages, float* sink,
                                                          const __grid_constant__ CUtensorMap x_map,
                                                          const __grid_constant__ CUtensorMap w_map) {
  extern __shared__ __align__(128) char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + stages * kStageBytes);
  const int n = blockIdx.x, steps = k_elems * 2 / kRowBytes, t = threadIdx.x;
  const uint32_t rank = kMode == 2 ? cluster_rank() : 0;
  if (kMode != 0 && t == 0) {
    for (int s = 0; s < stages; ++s) mbar_init(&full[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (kMode == 2) cluster_sync(); else __syncthreads();

  auto issue = [&](int step) {
    char* stage = smem + (step % stages) * kStageBytes;
    if (kMode == 0) {
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        int idx = j * kThreads + t;
        const char* src = row_src(x, w, n, k_elems, idx / kChunks, step) + (idx % kChunks) * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(stage + (idx / kChunks) * kPitch + (idx % kChunks) * 16)),
                     "l"(src));
      }
      asm volatile("cp.async.commit_group;");
    } else {
      uint64_t* bar = &full[step % stages];
      if (t == 0) mbar_expect_tx(bar, kRows * kRowBytes);
      if (kMode == 3) {
        if (t == 0) {
          const int col = ((step + kRotate * n) % steps) * (kRowBytes / 2);
          tma_2d(stage, &x_map, col, 0, bar);
          tma_2d(stage + 128 * kRowBytes, &w_map, col, n * 128, bar);
        }
      } else if (kMode == 1 || t >= 128) {
        bulk_row(stage + t * kPitch, row_src(x, w, n, k_elems, t, step), bar);
      } else if ((t >> 6) == (int)rank) {  // this CTA's half of X, to both CTAs
        bulk_row_multicast(stage + t * kPitch, row_src(x, w, n, k_elems, t, step), bar, 0x3);
      }
    }
  };

  for (int s = 0; s < stages - 1; ++s) issue(s);
  float acc = 0.f;
  for (int i = 0; i < steps; ++i) {
    if (kMode == 0) {
      // Groups committed so far: stages - 1 + i; step i's must be done.
      if (stages == 3) asm volatile("cp.async.wait_group 1;" ::: "memory");
      else if (stages == 4) asm volatile("cp.async.wait_group 2;" ::: "memory");
      else asm volatile("cp.async.wait_group 4;" ::: "memory");
      __syncthreads();
    } else {
      mbar_wait(&full[i % stages], (i / stages) & 1);
      if (kMode == 2) cluster_sync(); else __syncthreads();
    }
    if (i + stages - 1 < steps) issue(i + stages - 1);
    else if (kMode == 0) asm volatile("cp.async.commit_group;");
    acc += consume(smem + (i % stages) * kStageBytes);
  }
  if (kMode == 2) cluster_sync();  // no CTA exits while its peer may still multicast into it
  if (acc == 1234.5f) *sink = acc;
}

// A [rows, k] fp16 matrix as 128 x (kRowBytes / 2) boxes.
static CUtensorMap tensor_map(const char* base, int rows, int k) {
  CUtensorMap map;
  cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows};
  cuuint64_t strides[1] = {(cuuint64_t)k * 2};
  cuuint32_t box[2] = {kRowBytes / 2, 128}, elem[2] = {1, 1};
  CUresult r = cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, (void*)base, dims, strides, box, elem,
                                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", (int)r);
    exit(1);
  }
  return map;
}

template <int kMode>
float time_ms(const char* x, const char* w, int k, int n_tiles, int stages, float* sink) {
  const CUtensorMap x_map = tensor_map(x, 128, k), w_map = tensor_map(w, n_tiles * 128, k);
  size_t smem = stages * kStageBytes + 64;
  CHECK(cudaFuncSetAttribute(stream_kernel<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(n_tiles);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kMode == 2 ? 2 : 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> times;
  for (int r = 0; r < 25; ++r) {
    CHECK(cudaEventRecord(a));
    CHECK(cudaLaunchKernelEx(&cfg, stream_kernel<kMode>, x, w, k, stages, sink, x_map, w_map));
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int main(int argc, char** argv) {
  const int k = argc > 1 ? atoi(argv[1]) : 4096, n = argc > 2 ? atoi(argv[2]) : 16384;
  char *x, *w;
  float* sink;
  CHECK(cudaMalloc(&x, (size_t)128 * k * 2));
  CHECK(cudaMalloc(&w, (size_t)n * k * 2));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(x, 0, (size_t)128 * k * 2));
  CHECK(cudaMemset(w, 0, (size_t)n * k * 2));
  const double w_bytes = (double)n * k * 2, x_bytes = 128.0 * k * 2;
  for (int rotate : {0, 7}) {
  CHECK(cudaMemcpyToSymbol(kRotate, &rotate, sizeof(int)));
  for (int stages : {kRowBytes == 128 ? 4 : 3}) {
    float ms[4] = {time_ms<0>(x, w, k, n / 128, stages, sink), time_ms<1>(x, w, k, n / 128, stages, sink),
                   time_ms<2>(x, w, k, n / 128, stages, sink), time_ms<3>(x, w, k, n / 128, stages, sink)};
    for (int mode = 0; mode < 4; ++mode)
      printf("{\"rotate\": %d, \"mode\": %d, \"stages\": %d, \"k\": %d, \"n\": %d, \"us\": %.2f, \"hbm_gb_s\": %.0f}\n",
             rotate, mode, stages, k, n, ms[mode] * 1e3, (w_bytes + x_bytes) / (ms[mode] * 1e-3) / 1e9);
  }
  }
  return 0;
}
