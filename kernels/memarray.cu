// Kernels for emm's MemArray GPU tests. Compiled to PTX on a GPU machine with
//   nvcc -ptx -arch=compute_80 -o kernels/memarray.ptx kernels/memarray.cu
// and the PTX is committed (the build machine has no CUDA toolkit).
#include <stdint.h>

// Mirrors emm-array's Indexer: shape and row-major strides (in elements), rank <= 4.
struct Indexer {
    int64_t shape[4];
    int64_t strides[4];
    int32_t rank;
};

// data[idx] += sum of idx's multi-index components, for every element.
template <typename T>
__device__ void add_index_sum(T* data, Indexer ix, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int64_t rest = i, sum = 0, offset = 0;
    for (int d = 0; d < ix.rank; ++d) {
        int64_t inner = 1;
        for (int e = d + 1; e < ix.rank; ++e) inner *= ix.shape[e];
        int64_t c = rest / inner;
        rest -= c * inner;
        sum += c;
        offset += c * ix.strides[d];
    }
    data[offset] = (T)(data[offset] + (T)sum);
}

extern "C" {
__global__ void add_index_sum_i32(int32_t* d, Indexer ix, int64_t n) { add_index_sum(d, ix, n); }
__global__ void add_index_sum_i64(int64_t* d, Indexer ix, int64_t n) { add_index_sum(d, ix, n); }
__global__ void add_index_sum_f32(float* d, Indexer ix, int64_t n) { add_index_sum(d, ix, n); }
__global__ void add_index_sum_f64(double* d, Indexer ix, int64_t n) { add_index_sum(d, ix, n); }
__global__ void add_index_sum_u8(uint8_t* d, Indexer ix, int64_t n) { add_index_sum(d, ix, n); }
}
