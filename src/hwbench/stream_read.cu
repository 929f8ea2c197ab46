// How fast can a kernel read N bytes once from HBM (no write), by grid shape and loads in flight?
// The ceiling a streaming kernel such as decode attention (K and V read once) is judged against:
// its floor divides by the copy bandwidth, and a read of tens of MB also pays launch, ramp-up
// and tail. Each CTA reads one contiguous chunk (like a decode row split over CTAs) with 16-byte
// loads, `unroll` of them in flight per thread before their sum (streaming loads; unroll 4 also
// through the read-only path and as plain loads); the sums go to a sink.
// Timed like the suites: CUDA events over CUDA-graph replays of launches over input sets rotated
// past L2, median of 21 replays. Prints one JSON object (``stream_read CTAS THREADS``: just two
// launches over the first size, for a profiler). Build:
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o stream_read stream_read.cu
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "graph_timing.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

// kHint 0: __ldcs (streaming, evict first), 1: __ldg (read-only path), 2: a plain load.
template <int kUnroll, int kHint>
__global__ void read_chunks(const float4* __restrict__ src, size_t per_cta, float* sink) {
  const float4* base = src + blockIdx.x * per_cta;
  float acc = 0.f;
  for (size_t i = threadIdx.x; i < per_cta; i += size_t(blockDim.x) * kUnroll) {
    float4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      size_t j = i + size_t(u) * blockDim.x;
      float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
      if (j < per_cta) x = kHint == 0 ? __ldcs(base + j) : kHint == 1 ? __ldg(base + j) : base[j];
      v[u] = x;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc += v[u].x + v[u].y + v[u].z + v[u].w;
  }
  if (acc == 1.2345f) sink[threadIdx.x] = acc;  // never true for the random data; keeps the loads
}

// Decode attention's access shape: 8 lanes read one 128-byte key row (16 bytes each), so a warp
// holds 4 parts; each step part p reads kVector rows. kInterleave 0: part p's rows are its own
// kVector consecutive rows (what the fused loop's `vector` chunks give: a warp's load touches 4
// rows kVector rows apart); 1: row v of part p is v * parts + p (a warp's load: 4 adjacent rows).
template <int kVector, int kInterleave>
__global__ void read_parts(const float4* __restrict__ src, size_t per_cta, float* sink) {
  const float4* base = src + blockIdx.x * per_cta;
  const int lane = threadIdx.x % 8, part = threadIdx.x / 8, parts = blockDim.x / 8;
  const size_t step = size_t(parts) * kVector * 8;  // float4s per step of the CTA
  float acc = 0.f;
  for (size_t s = 0; s < per_cta; s += step) {
    float4 v[kVector];
#pragma unroll
    for (int u = 0; u < kVector; ++u) {
      int row = kInterleave ? u * parts + part : part * kVector + u;
      v[u] = __ldcs(base + s + size_t(row) * 8 + lane);
    }
#pragma unroll
    for (int u = 0; u < kVector; ++u) acc += v[u].x + v[u].y + v[u].z + v[u].w;
  }
  if (acc == 1.2345f) sink[threadIdx.x] = acc;
}

template <int kUnroll, int kHint = 0, int kParts = -1>
float time_us(const std::vector<float4*>& sets, size_t bytes, int ctas, int threads, float* sink) {
  size_t per_cta = bytes / 16 / ctas;
  return graph_us(4 * int(sets.size()), [&](int l, cudaStream_t stream) {
    if (kParts < 0)
      read_chunks<kUnroll, kHint><<<ctas, threads, 0, stream>>>(sets[l % sets.size()], per_cta, sink);
    else
      read_parts<kUnroll, kParts><<<ctas, threads, 0, stream>>>(sets[l % sets.size()], per_cta, sink);
  });
}

int main(int argc, char** argv) {
  const size_t sizes[] = {size_t(64) * 8192 * 64 * 4, size_t(32) * 16384 * 128 * 4,
                          size_t(256) * 4096 * 128 * 4};  // the decode shapes' K and V bytes
  const char* labels[] = {"decode 64x8192x64", "decode 32x16384x128", "decode 256x4096x128"};
  float* sink;
  CHECK(cudaMalloc(&sink, 4096 * sizeof(float)));
  if (argc == 3) {  // `stream_read CTAS THREADS`: two launches over the first size, for a profiler
    float4* src;
    CHECK(cudaMalloc(&src, sizes[0]));
    CHECK(cudaMemset(src, 0x3c, sizes[0]));
    int ctas = atoi(argv[1]), threads = atoi(argv[2]);
    for (int i = 0; i < 2; ++i) read_chunks<4, 0><<<ctas, threads>>>(src, sizes[0] / 16 / ctas, sink);
    CHECK(cudaDeviceSynchronize());
    return 0;
  }
  printf("{\"device_rows\": [\n");
  bool first = true;
  for (int s = 0; s < 3; ++s) {
    size_t bytes = sizes[s];
    int n_sets = int(std::max<size_t>(2, (size_t(200) << 20) / bytes + 1));  // > 4x the 50 MB L2
    std::vector<float4*> sets(n_sets);
    for (auto& p : sets) {
      CHECK(cudaMalloc(&p, bytes));
      CHECK(cudaMemset(p, 0x3c, bytes));  // fp16 1.0 pairs: finite, nonzero
    }
    for (int ctas : {128, 132, 256, 264, 512, 1056, 2048}) {
      if (bytes % (size_t(16) * ctas)) continue;
      for (int threads : {128, 256, 512, 1024}) {
        float us4 = time_us<4>(sets, bytes, ctas, threads, sink);
        float us8 = time_us<8>(sets, bytes, ctas, threads, sink);
        float ldg4 = time_us<4, 1>(sets, bytes, ctas, threads, sink);
        float plain4 = time_us<4, 2>(sets, bytes, ctas, threads, sink);
        size_t per_cta = bytes / 16 / ctas, step4 = size_t(threads) * 4, step8 = size_t(threads) * 8;
        float own4 = per_cta % step4 ? -1.f : time_us<4, 0, 0>(sets, bytes, ctas, threads, sink);
        float inter4 = per_cta % step4 ? -1.f : time_us<4, 0, 1>(sets, bytes, ctas, threads, sink);
        float own8 = per_cta % step8 ? -1.f : time_us<8, 0, 0>(sets, bytes, ctas, threads, sink);
        float inter8 = per_cta % step8 ? -1.f : time_us<8, 0, 1>(sets, bytes, ctas, threads, sink);
        printf("%s {\"label\": \"%s\", \"bytes\": %zu, \"ctas\": %d, \"threads\": %d, "
               "\"us_unroll4\": %.3f, \"us_unroll8\": %.3f, \"us_unroll4_ldg\": %.3f, "
               "\"us_unroll4_plain\": %.3f, \"us_parts_own4\": %.3f, \"us_parts_interleaved4\": %.3f, "
               "\"us_parts_own8\": %.3f, \"us_parts_interleaved8\": %.3f}",
               first ? "" : ",\n", labels[s], bytes, ctas, threads, us4, us8, ldg4, plain4,
               own4, inter4, own8, inter8);
        first = false;
      }
    }
    for (auto p : sets) CHECK(cudaFree(p));
  }
  printf("\n]}\n");
  return 0;
}
