// Hopper memory-hierarchy microbenchmark for tvm-dsm's hardware model.
// Measures HBM, L2, shared memory (SMEM) and distributed shared memory (DSM, by cluster size)
// bandwidth, and pointer-chase latency per level; prints one JSON object on stdout.
// Build: nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o hwbench hwbench.cu
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "cuda_check.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <time.h>
#include <vector>

namespace cg = cooperative_groups;

constexpr int kSmemFloat4 = 2048;  // 32 KiB of float4 per CTA for the SMEM/DSM kernels
constexpr int kThreads = 512;

__global__ void copy_kernel(const float4* __restrict__ src, float4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

__global__ void l2_read_kernel(const float4* __restrict__ src, size_t n, int reps, float* sink) {
  float acc = 0.f;
  for (int r = 0; r < reps; ++r)
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
      float4 v = __ldcg(src + i);
      acc += v.x + v.y + v.z + v.w;
    }
  if (acc == 1234.5f) *sink = acc;  // never true for the data used; keeps the loads alive
}

// DSM read bandwidth. pattern 0: each CTA reads its own SMEM (ld.shared); 1: the next rank's;
// 2: round-robin over all peers, a different one each iteration. 16-byte ld.shared::cluster.v4
// through mapa'd addresses; not volatile, so independent loads overlap.
__device__ __forceinline__ float4 ld_dsm_v4(uint32_t addr) {
  float4 v;
  asm("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}

__global__ void dsm_read_kernel(int iters, int pattern, float* sink) {  // + unused dynamic SMEM
  __shared__ float4 buf[kSmemFloat4];
  cg::cluster_group cluster = cg::this_cluster();
  for (int i = threadIdx.x; i < kSmemFloat4; i += blockDim.x) buf[i] = make_float4(i, 1, 2, 3);
  cluster.sync();  // peers have started and initialised their buffers
  const unsigned size = cluster.num_blocks(), rank = cluster.block_rank();
  const uint32_t local = (uint32_t)__cvta_generic_to_shared(buf);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int it = 0; it < iters; ++it) {
    unsigned peer = pattern == 1 ? (rank + 1) % size : (rank + 1 + it % (size - 1)) % size;
    uint32_t base;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(base) : "r"(local), "r"(peer));
#pragma unroll
    for (int u = 0; u < kSmemFloat4 / kThreads; ++u) {
      int j = (threadIdx.x + u * kThreads + it) & (kSmemFloat4 - 1);
      float4 v = pattern == 0 ? buf[j] : ld_dsm_v4(base + 16 * j);
      acc[u & 3] += v.x + v.w;
    }
  }
  cluster.sync();  // nobody exits while a peer still reads its SMEM
  if (acc[0] + acc[1] + acc[2] + acc[3] == 1234.5f) *sink = acc[0];
}

// Peak DSM bandwidth, two ways (the ceiling the collectives are compared with). Each CTA moves
// its kPeakBytes buffer `iters` times from/to its neighbour. Mode 0: every thread keeps 8
// independent 16-byte ld.shared::cluster.v4 in flight before using any. Mode 1: the copy engine,
// cp.async.bulk.shared::cluster pushes of 16 KiB to the previous rank, all completing on the
// receiver's mbarrier in one phase armed before the cluster barrier (iters <= 15: the
// transaction count stays below 2^20 bytes).
constexpr int kPeakBytes = 64 * 1024;
constexpr int kBulkChunk = 16 * 1024;

__global__ void dsm_peak_kernel(int iters, int mode, float* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  float4* src = reinterpret_cast<float4*>(smem);
  unsigned char* dst = smem + kPeakBytes;
  unsigned long long* bar = reinterpret_cast<unsigned long long*>(smem + 2 * kPeakBytes);
  cg::cluster_group cluster = cg::this_cluster();
  for (int i = threadIdx.x; i < kPeakBytes / 16; i += blockDim.x) src[i] = make_float4(i, 1, 2, 3);
  const uint32_t bar_addr = (uint32_t)__cvta_generic_to_shared(bar);
  if (threadIdx.x == 0 && mode == 1) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_addr));
    asm volatile("fence.mbarrier_init.release.cluster;");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_addr), "r"(iters * kPeakBytes) : "memory");
  }
  asm volatile("fence.proxy.async.shared::cta;");
  cluster.sync();
  const unsigned size = cluster.num_blocks(), rank = cluster.block_rank();
  float acc = 0.f;
  if (mode == 0) {
    uint32_t base;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(base) : "r"((uint32_t)__cvta_generic_to_shared(src)), "r"((rank + 1) % size));
    constexpr int kInFlight = 8;
    for (int it = 0; it < iters; ++it) {
      for (int j0 = threadIdx.x; j0 < kPeakBytes / 16; j0 += kInFlight * blockDim.x) {
        float4 v[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
          int j = (j0 + u * blockDim.x + it * 16) & (kPeakBytes / 16 - 1);
          asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                       : "=f"(v[u].x), "=f"(v[u].y), "=f"(v[u].z), "=f"(v[u].w) : "r"(base + 16 * j));
        }
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) acc += v[u].x + v[u].w;
      }
    }
  } else {
    const unsigned to = (rank + size - 1) % size;
    const int pushes = iters * (kPeakBytes / kBulkChunk);
    for (int k = threadIdx.x; k < pushes; k += blockDim.x) {
      const uint32_t offset = (k % (kPeakBytes / kBulkChunk)) * kBulkChunk;
      uint32_t remote_dst, remote_bar;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_dst) : "r"((uint32_t)__cvta_generic_to_shared(dst) + offset), "r"(to));
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_bar) : "r"(bar_addr), "r"(to));
      asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                   ::"r"(remote_dst), "r"((uint32_t)__cvta_generic_to_shared(src) + offset), "r"(kBulkChunk), "r"(remote_bar) : "memory");
    }
    asm volatile(
        "{\n .reg .pred p;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n"
        " @!p bra WAIT;\n}\n" ::"r"(bar_addr) : "memory");
  }
  cluster.sync();  // nobody exits while a peer still reads or writes its SMEM
  if (acc == 1234.5f) *sink = acc;
}

// One thread follows a chain of indices; returns clock cycles per hop.
__global__ void chase_global(const unsigned* __restrict__ next, int hops, unsigned long long* cycles, unsigned* sink) {
  unsigned j = 0;
  for (int h = 0; h < 256; ++h) j = __ldcg(next + j);  // warm TLB / cache state
  long long t0 = clock64();
  for (int h = 0; h < hops; ++h) j = __ldcg(next + j);
  long long t1 = clock64();
  *cycles = (t1 - t0);
  *sink = j;
}

constexpr int kChase = 4096;
__global__ void chase_smem(int remote, int hops, unsigned long long* cycles, unsigned* sink) {
  __shared__ unsigned next[kChase];
  cg::cluster_group cluster = cg::this_cluster();
  for (int i = threadIdx.x; i < kChase; i += blockDim.x) next[i] = (i * 1031 + 7) % kChase;
  cluster.sync();
  if (cluster.block_rank() == 0 && threadIdx.x == 0) {
    const unsigned* chain = remote ? cluster.map_shared_rank(next, 1) : next;
    unsigned j = 0;
    for (int h = 0; h < 64; ++h) j = chain[j];
    long long t0 = clock64();
    for (int h = 0; h < hops; ++h) j = chain[j];
    long long t1 = clock64();
    *cycles = t1 - t0;
    *sink = j;
  }
  cluster.sync();
}

static float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

template <typename F>
static double median_ms(F launch, int reps = 9) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  launch();  // warm-up
  CHECK(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaGetLastError());
    t.push_back(elapsed_ms(a, b));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

static cudaLaunchConfig_t cluster_config(int clusters, int size, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(clusters * size);
  cfg.blockDim = dim3(kThreads);
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = size;
  attr->val.clusterDim.y = attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Target of the cluster-residency query (never launched).
__global__ void occupancy_probe_kernel(float* sink) {
  if (sink) sink[0] = 0.f;
}

// How many clusters of each size (1-16) can be resident at once, with one and with two CTAs
// of 256 threads per SM (the SMEM per CTA decides which): a cluster's CTAs must share a GPC,
// so the resident CTAs of larger clusters fall short of SMs x CTAs per SM.
static std::string cluster_residency_json(const cudaDeviceProp& p) {
  CHECK(cudaFuncSetAttribute(occupancy_probe_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CHECK(cudaFuncSetAttribute(occupancy_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)p.sharedMemPerBlockOptin));
  std::string out;
  for (int per_sm : {1, 2}) {
    // The largest SMEM per CTA that still fits per_sm CTAs (1 KB per CTA is the driver's).
    const size_t smem = std::min(p.sharedMemPerBlockOptin, p.sharedMemPerMultiprocessor / per_sm - 1024);
    std::string row;
    for (int size = 1; size <= 16; ++size) {
      cudaLaunchAttribute attr;
      cudaLaunchConfig_t cfg = cluster_config(1, size, &attr);
      cfg.dynamicSmemBytes = smem;
      int clusters = 0;
      CHECK(cudaOccupancyMaxActiveClusters(&clusters, (void*)occupancy_probe_kernel, &cfg));
      row += (row.empty() ? "" : ", ") + std::string("\"") + std::to_string(size) + "\": " + std::to_string(clusters);
    }
    out += (out.empty() ? "" : ", ") + std::string("\"") + std::to_string(per_sm) + "\": {" + row + "}";
  }
  return out;
}

int main() {
  cudaDeviceProp p;
  CHECK(cudaGetDeviceProperties(&p, 0));
  int clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  float* sink;
  unsigned* usink;
  unsigned long long* cycles;
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMalloc(&usink, 4));
  CHECK(cudaMalloc(&cycles, 8));
  CHECK(cudaFuncSetAttribute(dsm_read_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  // Unused dynamic SMEM limits residency to one CTA per SM (one of the configurations probed).
  const int kOneCtaPerSm = 160 * 1024;
  CHECK(cudaFuncSetAttribute(dsm_read_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kOneCtaPerSm));
  CHECK(cudaFuncSetAttribute(chase_smem, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CHECK(cudaFuncSetAttribute(dsm_peak_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CHECK(cudaFuncSetAttribute(dsm_peak_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * kPeakBytes + 16));

  fprintf(stderr, "hwbench: HBM copy\n");  // progress, so a hang shows where
  // HBM: copy 1 GiB -> 1 GiB, bytes read + written.
  size_t n = (size_t)1 << 26;  // float4 elements = 1 GiB
  float4 *a, *b;
  CHECK(cudaMalloc(&a, n * 16));
  CHECK(cudaMalloc(&b, n * 16));
  CHECK(cudaMemset(a, 0, n * 16));
  double hbm_ms = median_ms([&] { copy_kernel<<<p.multiProcessorCount * 8, 512>>>(a, b, n); });
  double hbm_bw = 2.0 * n * 16 / (hbm_ms * 1e-3);

  fprintf(stderr, "hwbench: L2 read\n");
  // L2: 16 MiB read 20 times by every SM (fits the 50 MB L2).
  size_t nl2 = ((size_t)16 << 20) / 16;
  double l2_ms = median_ms([&] { l2_read_kernel<<<p.multiProcessorCount * 4, 512>>>(a, nl2, 20, sink); });
  double l2_bw = 20.0 * nl2 * 16 / (l2_ms * 1e-3);

  fprintf(stderr, "hwbench: SMEM and DSM reads\n");
  // SMEM (pattern 0) and DSM (best of patterns 1 and 2) by cluster size, one wave of clusters.
  const int iters = 400;
  std::string dsm_json, smem_json;
  double smem_bw_best = 0;
  for (int size : {1, 2, 4, 8, 16}) {
    // Best over residency (as many CTAs per SM as fit, or one) and access pattern.
    double local = 0, neighbour = 0, round_robin = 0;
    int clusters_used = 0;
    for (int dyn : {0, kOneCtaPerSm}) {
      cudaLaunchAttribute attr;
      cudaLaunchConfig_t cfg = cluster_config(1, size, &attr);
      cfg.dynamicSmemBytes = dyn;
      int max_clusters = 0;
      CHECK(cudaOccupancyMaxActiveClusters(&max_clusters, (void*)dsm_read_kernel, &cfg));
      if (max_clusters == 0) continue;
      cfg = cluster_config(max_clusters, size, &attr);
      cfg.dynamicSmemBytes = dyn;
      double bytes = (double)max_clusters * size * kSmemFloat4 * 16.0 * iters;
      auto bw = [&](int pattern) {
        double ms = median_ms([&] { CHECK(cudaLaunchKernelEx(&cfg, dsm_read_kernel, iters, pattern, sink)); });
        return bytes / (ms * 1e-3);
      };
      double l = bw(0);
      if (l > local) local = l;
      if (size == 1) continue;
      double nb = bw(1), rr = bw(2);
      if (std::max(nb, rr) > std::max(neighbour, round_robin)) clusters_used = max_clusters;
      neighbour = std::max(neighbour, nb);
      round_robin = std::max(round_robin, rr);
    }
    auto entry = [&](double v, const std::string& extra) {
      return "\"" + std::to_string(size) + "\": {\"bytes_per_s\": " + std::to_string(v) + extra + "}";
    };
    smem_bw_best = std::max(smem_bw_best, local);
    smem_json += (smem_json.empty() ? "" : ", ") + entry(local, "");
    if (size == 1) continue;
    std::string extra = ", \"active_clusters\": " + std::to_string(clusters_used) +
                        ", \"neighbour_bytes_per_s\": " + std::to_string(neighbour) +
                        ", \"round_robin_bytes_per_s\": " + std::to_string(round_robin);
    dsm_json += (dsm_json.empty() ? "" : ", ") + entry(std::max(neighbour, round_robin), extra);
  }

  // Peak DSM bandwidth by cluster size: best of register loads and bulk copies, one CTA per SM.
  std::string peak_json;
  for (int size : {2, 4, 8, 16}) {
    fprintf(stderr, "hwbench: DSM peak, cluster %d\n", size);
    cudaLaunchAttribute attr;
    const int dyn = 2 * kPeakBytes + 16;
    cudaLaunchConfig_t cfg = cluster_config(1, size, &attr);
    cfg.dynamicSmemBytes = dyn;
    int max_clusters = 0;
    CHECK(cudaOccupancyMaxActiveClusters(&max_clusters, (void*)dsm_peak_kernel, &cfg));
    cfg = cluster_config(max_clusters, size, &attr);
    cfg.dynamicSmemBytes = dyn;
    // Bandwidth from the difference of a long and a short run (launch and barriers cancel).
    const int long_iters[2] = {200, 15}, short_iters = 1;
    double by_mode[2];
    for (int mode : {0, 1}) {
      auto run = [&](int iters) {
        // A probe that hangs (a lost mbarrier completion) is reported, not waited on forever.
        CHECK(cudaLaunchKernelEx(&cfg, dsm_peak_kernel, iters, mode, sink));
        for (int ms = 0; cudaStreamQuery(0) == cudaErrorNotReady; ++ms) {
          if (ms > 10000) {
            fprintf(stderr, "dsm peak probe mode %d hangs at cluster %d\n", mode, size);
            exit(2);
          }
          struct timespec t = {0, 1000000};
          nanosleep(&t, nullptr);
        }
        return median_ms([&] { CHECK(cudaLaunchKernelEx(&cfg, dsm_peak_kernel, iters, mode, sink)); }, 21);
      };
      double ms = run(long_iters[mode]) - run(short_iters);
      by_mode[mode] = (double)max_clusters * size * kPeakBytes * (long_iters[mode] - short_iters) / (ms * 1e-3);
    }
    peak_json += (peak_json.empty() ? "" : ", ") + std::string("\"") + std::to_string(size) +
                 "\": {\"bytes_per_s\": " + std::to_string(std::max(by_mode[0], by_mode[1])) +
                 ", \"active_clusters\": " + std::to_string(max_clusters) +
                 ", \"loads_bytes_per_s\": " + std::to_string(by_mode[0]) +
                 ", \"bulk_bytes_per_s\": " + std::to_string(by_mode[1]) + "}";
  }

  fprintf(stderr, "hwbench: latency\n");
  // Latency: one thread chasing pointers.
  auto cyc = [&] {
    unsigned long long c;
    CHECK(cudaMemcpy(&c, cycles, 8, cudaMemcpyDeviceToHost));
    return (double)c;
  };
  const int hops = 2000;
  double lat_smem, lat_dsm;
  {
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = cluster_config(1, 2, &attr);
    cfg.blockDim = dim3(128);
    CHECK(cudaLaunchKernelEx(&cfg, chase_smem, 0, hops, cycles, usink));
    CHECK(cudaDeviceSynchronize());
    lat_smem = cyc() / hops;
    CHECK(cudaLaunchKernelEx(&cfg, chase_smem, 1, hops, cycles, usink));
    CHECK(cudaDeviceSynchronize());
    lat_dsm = cyc() / hops;
  }
  auto chase = [&](size_t bytes) {
    size_t m = bytes / 4, stride = 4096 / 4 + 1;  // > one page apart, no two hops in one line
    std::vector<unsigned> host(m);
    size_t count = m / stride;
    std::vector<unsigned> order(count);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin() + 1, order.end(), std::mt19937(42));
    for (size_t i = 0; i < count; ++i) host[order[i] * stride] = order[(i + 1) % count] * stride;
    CHECK(cudaMemcpy(a, host.data(), m * 4, cudaMemcpyHostToDevice));
    chase_global<<<1, 1>>>((const unsigned*)a, hops, cycles, usink);
    CHECK(cudaDeviceSynchronize());
    return cyc() / hops;
  };
  double lat_l2 = chase((size_t)8 << 20);
  double lat_hbm = chase((size_t)1 << 30);

  double ns = 1e6 / clock_khz;  // ns per cycle at the reported (boost) clock
  printf("{\n \"device\": \"%s\",\n \"sm_count\": %d,\n \"cc\": \"%d.%d\",\n", p.name, p.multiProcessorCount, p.major, p.minor);
  printf(" \"smem_per_cta_optin_bytes\": %zu,\n \"smem_per_sm_bytes\": %zu,\n", p.sharedMemPerBlockOptin, p.sharedMemPerMultiprocessor);
  printf(" \"regs_per_sm\": %d,\n \"regs_per_cta\": %d,\n \"l2_bytes\": %d,\n \"clock_khz\": %d,\n", p.regsPerMultiprocessor, p.regsPerBlock, p.l2CacheSize, clock_khz);
  printf(" \"max_cluster_size\": 16,\n \"max_portable_cluster_size\": 8,\n");
  printf(" \"bandwidth_bytes_per_s\": {\"hbm_copy\": %.6g, \"l2_read\": %.6g, \"smem_read\": %.6g},\n", hbm_bw, l2_bw, smem_bw_best);
  printf(" \"smem_read_by_cluster_size\": {%s},\n", smem_json.c_str());
  printf(" \"dsm_read_by_cluster_size\": {%s},\n", dsm_json.c_str());
  printf(" \"dsm_peak_by_cluster_size\": {%s},\n", peak_json.c_str());
  printf(" \"active_clusters_by_ctas_per_sm\": {%s},\n", cluster_residency_json(p).c_str());
  printf(" \"latency_cycles\": {\"smem\": %.1f, \"dsm\": %.1f, \"l2\": %.1f, \"hbm\": %.1f},\n", lat_smem, lat_dsm, lat_l2, lat_hbm);
  printf(" \"latency_ns\": {\"smem\": %.1f, \"dsm\": %.1f, \"l2\": %.1f, \"hbm\": %.1f}\n}\n", lat_smem * ns, lat_dsm * ns, lat_l2 * ns, lat_hbm * ns);
  return 0;
}
