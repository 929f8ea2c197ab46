// Does decode attention's K/V access pattern, without its arithmetic, read at the HBM floor?
// stream_read showed a plain read of the same bytes does (given 16 warps per SM); the fused
// decode kernels stop near 2.5 TB/s on 64x8192x64 whatever their split. This replays their
// loads exactly: rows x keys x 64 fp16 (128-byte key rows), K and V two tensors, a row split
// over `ranks` CTAs (a cluster) of `groups` parts of 8 lanes, part p = group * ranks + rank,
// each step `vector` keys of K and of V per part, summed. Orders:
//   0 interleaved: key = (step * parts + p) * vector + j    (the fused loop's order)
//   1 rank-contiguous: rank r owns keys [r, r+1) * keys / ranks, its groups interleaved
//   2 V one step behind K: as 0, V read for the step before (the fused loop could use V late)
// Layouts: K and V in two allocations (as torch gives them), or one allocation with V at
// K + size + `gap` bytes (gap 0: a power-of-two distance).
// Timed like stream_read (graph_timing.h) over input sets rotated past L2. Prints one JSON object. Build:
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o decode_read decode_read.cu
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "graph_timing.h"

#include <cstdio>
#include <vector>

constexpr int kLanes = 8;  // 16-byte slices of a 128-byte key row

__device__ __forceinline__ float sum4(float4 v) { return v.x + v.y + v.z + v.w; }

template <int kVector, int kOrder>
__global__ void read_kv(const float4* __restrict__ k, const float4* __restrict__ v, int keys,
                        int ranks, float* sink) {
  const int lane = threadIdx.x % kLanes, group = threadIdx.x / kLanes, groups = blockDim.x / kLanes;
  const int rank = blockIdx.x % ranks, row = blockIdx.x / ranks, parts = groups * ranks;
  const size_t base = size_t(row) * keys * kLanes + lane;
  const int steps = keys / (parts * kVector);
  float acc = 0.f;
  for (int s = 0; s < steps; ++s) {
    float4 kx[kVector], vx[kVector];
#pragma unroll
    for (int j = 0; j < kVector; ++j) {
      int key = kOrder == 1 ? rank * (keys / ranks) + (s * groups + group) * kVector + j
                            : (s * parts + group * ranks + rank) * kVector + j;
      int vkey = kOrder == 2 ? (((s + steps - 1) % steps) * parts + group * ranks + rank) * kVector + j : key;
      kx[j] = k[base + size_t(key) * kLanes];
      vx[j] = v[base + size_t(vkey) * kLanes];
    }
#pragma unroll
    for (int j = 0; j < kVector; ++j) acc += sum4(kx[j]) * sum4(vx[j]);
  }
  if (acc == 1.2345f) sink[threadIdx.x] = acc;  // never true for the data; keeps the loads
}

struct Split {
  int ranks, groups, vector;
};

template <int kVector, int kOrder>
void launch(const Split& sp, const float4* k, const float4* v, int rows, int keys, float* sink,
            cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(rows * sp.ranks);
  cfg.blockDim = dim3(sp.groups * kLanes);
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = sp.ranks;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&cfg, read_kv<kVector, kOrder>, k, v, keys, sp.ranks, sink));
}

template <int kOrder>
void launch_any(const Split& sp, const float4* k, const float4* v, int rows, int keys, float* sink,
                cudaStream_t stream) {
  switch (sp.vector) {
    case 2: return launch<2, kOrder>(sp, k, v, rows, keys, sink, stream);
    case 4: return launch<4, kOrder>(sp, k, v, rows, keys, sink, stream);
    case 8: return launch<8, kOrder>(sp, k, v, rows, keys, sink, stream);
    default: fprintf(stderr, "vector %d\n", sp.vector); exit(1);
  }
}

struct Inputs {
  std::vector<float4*> k, v;
};

float time_us(const Inputs& in, const Split& sp, int order, int rows, int keys, float* sink) {
  return graph_us(4 * int(in.k.size()), [&](int l, cudaStream_t stream) {
    const float4 *k = in.k[l % in.k.size()], *v = in.v[l % in.v.size()];
    if (order == 0) launch_any<0>(sp, k, v, rows, keys, sink, stream);
    if (order == 1) launch_any<1>(sp, k, v, rows, keys, sink, stream);
    if (order == 2) launch_any<2>(sp, k, v, rows, keys, sink, stream);
  });
}

// Input sets rotated past the 50 MB L2: K and V apart (gap < 0) or V at K + bytes + gap.
Inputs allocate(size_t bytes, long gap, int sets, std::vector<void*>& owned) {
  Inputs in;
  for (int s = 0; s < sets; ++s) {
    if (gap < 0) {
      void *k, *v;
      CHECK(cudaMalloc(&k, bytes));
      CHECK(cudaMalloc(&v, bytes));
      CHECK(cudaMemset(k, 0x3c, bytes));  // fp16 1.0 pairs: finite, nonzero
      CHECK(cudaMemset(v, 0x3c, bytes));
      owned.push_back(k);
      owned.push_back(v);
      in.k.push_back(static_cast<float4*>(k));
      in.v.push_back(static_cast<float4*>(v));
    } else {
      void* both;
      CHECK(cudaMalloc(&both, 2 * bytes + gap));
      CHECK(cudaMemset(both, 0x3c, 2 * bytes + gap));
      owned.push_back(both);
      in.k.push_back(static_cast<float4*>(both));
      in.v.push_back(reinterpret_cast<float4*>(static_cast<char*>(both) + bytes + gap));
    }
  }
  return in;
}

int main() {
  const int rows = 64, keys = 8192;
  const size_t bytes = size_t(rows) * keys * kLanes * 16;  // one of K, V: 64 MiB
  float* sink;
  CHECK(cudaMalloc(&sink, 4096 * sizeof(float)));
  // The fused decode's splits near its best (decode_wide.json) and denser ones.
  const Split splits[] = {{1, 64, 4}, {2, 32, 8}, {2, 64, 4}, {4, 16, 4}, {4, 32, 4},
                          {4, 32, 2}, {8, 16, 4}, {8, 16, 2}, {4, 64, 2}};
  const long gaps[] = {-1, 0, 4096, 65536 + 512};
  const char* orders[] = {"interleaved", "rank_contiguous", "v_one_step_behind"};
  printf("{\"rows\": %d, \"keys\": %d, \"dim\": 64, \"bytes_k_plus_v\": %zu, \"device_rows\": [\n",
         rows, keys, 2 * bytes);
  bool first = true;
  for (long gap : gaps) {
    std::vector<void*> owned;
    Inputs in = allocate(bytes, gap, 3, owned);  // 3 x 134 MB > 2 x L2 per set switch
    for (const Split& sp : splits) {
      if (keys % (sp.ranks * sp.groups * sp.vector)) continue;
      for (int order = 0; order < 3; ++order) {
        float us = time_us(in, sp, order, rows, keys, sink);
        printf("%s {\"layout\": \"%s\", \"gap\": %ld, \"ranks\": %d, \"groups\": %d, "
               "\"vector\": %d, \"order\": \"%s\", \"us\": %.3f}",
               first ? "" : ",\n", gap < 0 ? "two_allocations" : "one_allocation", gap, sp.ranks,
               sp.groups, sp.vector, orders[order], us);
        first = false;
        fflush(stdout);
      }
    }
    for (void* p : owned) CHECK(cudaFree(p));
  }
  printf("\n]}\n");
  return 0;
}
