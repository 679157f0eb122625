"""Quantisers: round trips, partial groups, zero groups, power-of-two scales."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_fp8
from jax_fp8 import quantize

# e4m3 keeps 3 mantissa bits: round-to-nearest is within 2^-4 relative of each
# element; the RMS of the round trip error is well under that.
ROUND_TRIP_REL = 2.0 ** -4


def _rel(x, y):
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  return np.linalg.norm(x - y) / np.linalg.norm(y)


@pytest.mark.parametrize("shape", [(5, 300), (2, 3, 128), (1,), (4, 1000)])
@pytest.mark.parametrize("pow2", [False, True])
def test_quantize_1x128_round_trip(shape, pow2):
  x = jax.random.normal(jax.random.key(1), shape, jnp.float32) * 3.0
  q, s = jax_fp8.quantize_1x128(x, power_of_two_scales=pow2)
  kb = -(-shape[-1] // 128)
  assert q.dtype == jnp.float8_e4m3fn and q.shape == shape
  assert s.dtype == jnp.float32 and s.shape == (*shape[:-1], kb)
  back = jax_fp8.dequantize_1x128(q, s, jnp.float32)
  assert _rel(back, x) < ROUND_TRIP_REL
  # Each group's largest element lands on +-448 exactly (amax / 448 scaling).
  if not pow2:
    qa = np.abs(np.asarray(q.astype(jnp.float32)))
    padded = np.pad(qa, [(0, 0)] * (qa.ndim - 1) + [(0, kb * 128 - shape[-1])])
    group_max = padded.reshape(*shape[:-1], kb, 128).max(-1)
    np.testing.assert_array_equal(group_max, 448.0)
  else:
    log2 = np.log2(np.asarray(s))
    np.testing.assert_array_equal(log2, np.round(log2))
    assert np.all(np.abs(np.asarray(q.astype(jnp.float32))) <= 448.0)


@pytest.mark.parametrize("shape", [(256, 384), (130, 200), (1, 5)])
@pytest.mark.parametrize("pow2", [False, True])
def test_quantize_128x128_round_trip(shape, pow2):
  w = jax.random.normal(jax.random.key(2), shape, jnp.bfloat16)
  q, s = jax_fp8.quantize_128x128(w, power_of_two_scales=pow2)
  assert q.shape == shape and s.shape == (-(-shape[0] // 128), -(-shape[1] // 128))
  back = jax_fp8.dequantize_128x128(q, s, jnp.float32)
  assert _rel(back, w.astype(jnp.float32)) < ROUND_TRIP_REL
  assert jax_fp8.dequantize_128x128(q, s, jnp.bfloat16).dtype == jnp.bfloat16


def test_scales_are_group_amax_over_448():
  x = jax.random.normal(jax.random.key(3), (3, 256), jnp.float32)
  _, s = jax_fp8.quantize_1x128(x)
  want = np.abs(np.asarray(x)).reshape(3, 2, 128).max(-1) / 448.0
  np.testing.assert_allclose(np.asarray(s), want, rtol=1e-6)
  w = jax.random.normal(jax.random.key(4), (256, 128), jnp.float32)
  _, s = jax_fp8.quantize_128x128(w)
  want = np.abs(np.asarray(w)).reshape(2, 128, 1, 128).max((1, 3)) / 448.0
  np.testing.assert_allclose(np.asarray(s), want, rtol=1e-6)


def test_zero_groups_give_finite_scales_and_zeros():
  x = jnp.zeros((2, 300), jnp.float32).at[0, 130].set(5.0)
  for pow2 in (False, True):
    q, s = jax_fp8.quantize_1x128(x, power_of_two_scales=pow2)
    assert np.all(np.isfinite(np.asarray(s))) and np.all(np.asarray(s) > 0)
    qf = np.asarray(q.astype(jnp.float32))
    assert not np.any(np.isnan(qf))
    assert np.count_nonzero(qf) == 1
    w = jnp.zeros((200, 130), jnp.bfloat16)
    q, s = jax_fp8.quantize_128x128(w, power_of_two_scales=pow2)
    assert np.all(np.isfinite(np.asarray(s))) and not np.any(np.asarray(q.astype(jnp.float32)))


def test_quantizers_jit_and_reject_bad_input():
  x = jax.random.normal(jax.random.key(5), (4, 256))
  q1, s1 = jax.jit(jax_fp8.quantize_1x128)(x)
  q2, s2 = jax_fp8.quantize_1x128(x)
  np.testing.assert_array_equal(np.asarray(s1), np.asarray(s2))
  with pytest.raises(TypeError, match="x must be a floating-point"):
    jax_fp8.quantize_1x128(jnp.ones((4, 128), jnp.int32))
  with pytest.raises(ValueError, match="w must be 2-D"):
    jax_fp8.quantize_128x128(jnp.ones((2, 4, 128)))
  with pytest.raises(ValueError, match="scale must have shape"):
    jax_fp8.dequantize_1x128(q2, s2[:, :1])
  with pytest.raises(ValueError, match="scale must have shape"):
    jax_fp8.dequantize_128x128(q2, jnp.ones((2, 2)))
  assert quantize.num_blocks(129) == 2
