"""Building, loading and calling kernels: the CPU through ctypes, GPUs through the CUDA driver."""
