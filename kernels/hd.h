// DSF_HD marks a function compiled for both the CPU and the CUDA device (shared definitions
// such as hc/split_math.h and linear/digits.h).
#pragma once

#ifdef __CUDACC__
#define DSF_HD __host__ __device__
#else
#define DSF_HD
#endif
