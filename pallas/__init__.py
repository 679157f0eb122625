"""Pallas Mosaic GPU kernels of jax_fp8 (installed as the subpackage jax_fp8.pallas)."""
