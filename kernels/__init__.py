"""Engines for MoE kernels: Weave's (c, K) SM-partition model and its tables and calibration
(`kernels.weave`, `kernels.tables`, `kernels.calibrate`, `kernels.store`), the measurement job
(`kernels.measure`) and Triton kernels (`kernels.fused_moe`, `kernels.weave_kernel`).

Sits beside cost_model in the layers: imports specs, clusters, numpy/scipy, and torch / triton /
ray only inside functions. A cost model prices a Weave-style megakernel with
`kernels.weave.moe_layer_time(shape, tokens, ep, skew, hw)`.
"""
