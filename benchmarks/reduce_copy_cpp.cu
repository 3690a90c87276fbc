// The C++ side of the "DSL tax" benchmark: the LSA reduce+copy kernel of
// benchmarks/lsa_bench.py written directly against nccl_device.h.
// dst@p[i] = sum over LSA ranks q of src@q[i], for every LSA rank p.
#include <nccl_device.h>

extern "C" __global__ void reduce_copy_cpp(ncclWindow_t src, ncclWindow_t dst, long long count, int lsa_size) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
    float acc = ((float*)ncclGetLsaPointer(src, 0, 0))[i];
    for (int p = 1; p < lsa_size; p++) acc += ((float*)ncclGetLsaPointer(src, 0, p))[i];
    for (int p = 0; p < lsa_size; p++) ((float*)ncclGetLsaPointer(dst, 0, p))[i] = acc;
  }
}

// The same with 16-byte accesses (float4), as flowdsl's mem.load_vec/store_vec do.
extern "C" __global__ void reduce_copy_vec_cpp(ncclWindow_t src, ncclWindow_t dst, long long count, int lsa_size) {
  long long stride = (long long)gridDim.x * blockDim.x;
  long long nvec = count / 4;
  for (long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += stride) {
    float4 acc = ((float4*)ncclGetLsaPointer(src, 0, 0))[v];
    for (int p = 1; p < lsa_size; p++) {
      float4 x = ((float4*)ncclGetLsaPointer(src, 0, p))[v];
      acc.x += x.x; acc.y += x.y; acc.z += x.z; acc.w += x.w;
    }
    for (int p = 0; p < lsa_size; p++) ((float4*)ncclGetLsaPointer(dst, 0, p))[v] = acc;
  }
}

// An empty kernel, to measure launch overhead.
extern "C" __global__ void empty_cpp(ncclWindow_t src, long long count) {}
