// Is compute-sanitizer memcheck's "Invalid __shared__ write ... not located in remote CTA" on the
// cp.async.bulk collectives about copies whose shared::cluster destination is the issuing CTA?
// Clusters of 2 CTAs; thread 0 of each CTA bulk-copies its N floats to rank (mode 0: itself,
// mode 1: the other CTA) through a mapa'd shared::cluster address, completing on the receiver's
// mbarrier. Usage: bulk_self_copy MODE; prints OK or FAIL. Build: nvcc -arch=sm_90a -O3.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

constexpr int N = 1024;

__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(128) copy(float* out, int mode) {
  extern __shared__ __align__(128) float buf[];  // [0, N): source, [N, 2N): destination
  __shared__ __align__(8) unsigned long long mbar;
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  for (int i = threadIdx.x; i < 2 * N; i += blockDim.x) buf[i] = i < N ? rank * 100000.0f + i : -1.0f;
  unsigned mbar_addr = (unsigned)__cvta_generic_to_shared(&mbar);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(mbar_addr));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mbar_addr), "r"(N * 4) : "memory");
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
  if (threadIdx.x == 0) {
    unsigned target = mode == 0 ? rank : rank ^ 1u;
    unsigned src = (unsigned)__cvta_generic_to_shared(buf);
    unsigned dst_local = (unsigned)__cvta_generic_to_shared(buf + N);
    unsigned dst, remote_mbar;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(dst) : "r"(dst_local), "r"(target));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_mbar) : "r"(mbar_addr), "r"(target));
    asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "r"(src), "r"(N * 4), "r"(remote_mbar) : "memory");
  }
  asm volatile("{\n\t.reg .pred p;\n\tWAIT:\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n\t@!p bra WAIT;\n\t}"
               ::"r"(mbar_addr) : "memory");
  asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
  for (int i = threadIdx.x; i < N; i += blockDim.x) out[blockIdx.x * N + i] = buf[N + i];
}

int main(int argc, char** argv) {
  int mode = argc > 1 ? atoi(argv[1]) : 0, blocks = 4;
  float* out;
  cudaMalloc(&out, blocks * N * sizeof(float));
  cudaFuncSetAttribute(copy, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * N * 4);
  copy<<<blocks, 128, 2 * N * 4>>>(out, mode);
  cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) { printf("FAIL %s\n", cudaGetErrorString(err)); return 1; }
  float* host = (float*)malloc(blocks * N * sizeof(float));
  cudaMemcpy(host, out, blocks * N * sizeof(float), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int b = 0; b < blocks; ++b) {
    unsigned from = mode == 0 ? b % 2 : (b % 2) ^ 1u;
    for (int i = 0; i < N; ++i) bad += host[b * N + i] != from * 100000.0f + i;
  }
  printf("%s mode=%d bad=%d\n", bad ? "FAIL" : "OK", mode, bad);
  return bad != 0;
}
