"""The benchmarks' workloads: cases, input sets, references and contenders.

    common    block arithmetic, random operands, jax_fp8 backend names
    dense     jax_fp8.blockwise_fp8_dot against cuBLAS, DeepGEMM, XLA FP8 and bf16
    grouped   the MoE grouped GEMMs (ragged / masked) against ragged_dot and DeepGEMM
    training  forward + backward of one layer (jax_fp8.dense) and its wgrad GEMM
    mlp       a DeepSeek-V3 dense MLP forward, bf16 against FP8
    deepgemm  DeepGEMM's calls, where `import deep_gemm` works (built on the device)
"""
