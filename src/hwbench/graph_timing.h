// graph_us(launches, launch): median GPU time of one launch, timed like the Python suites: the
// launches (launch(l, stream) for l = 0 .. launches-1, e.g. rotating input sets past L2) are
// captured into one CUDA graph, replayed 24 times with CUDA events around each replay, the
// first 3 replays warming up. Shared by the standalone microbenchmarks in this folder.
#pragma once
#include <algorithm>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_check.h"

template <typename Launch>
float graph_us(int launches, Launch launch) {
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int l = 0; l < launches; ++l) launch(l, stream);
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<float> samples;
  for (int rep = 0; rep < 24; ++rep) {
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (rep >= 3) samples.push_back(ms * 1000.f / launches);
  }
  std::sort(samples.begin(), samples.end());
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(stream));
  return samples[samples.size() / 2];
}
