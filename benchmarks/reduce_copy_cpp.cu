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
