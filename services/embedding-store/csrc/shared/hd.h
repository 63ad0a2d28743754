// STREAMREC_HD marks the functions of the shared row math (this folder): host and device
// under nvcc, plain host functions under g++ (the CPU core, the CPU build of the kernels).
// The math has no device-only branch: what the CPU tests run is what the GPU runs.
#pragma once

#if defined(__CUDACC__)
#define STREAMREC_HD __host__ __device__
#else
#define STREAMREC_HD
#endif
