"""Fused RMSNorm for CUDA (CuPy), its float64 reference, validation, benchmark and shape policy."""
