// FT_HD: functions shared by the kernels and their CPU twins / host tests — host and device inline under nvcc, plain
// inline in host-only translation units (the layout headers include this so the CPU tests compile them as C++).
#pragma once

#ifndef FT_HD
#if defined(__CUDACC__)
#define FT_HD __host__ __device__ __forceinline__
#else
#define FT_HD inline
#endif
#endif
