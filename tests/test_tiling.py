"""The Hopper tiling (pallas/hopper_tiling.py) and its cost model
(pallas/hopper_cost.py), without a GPU (the SM count pinned to the H100's 132).

The default config is the candidate the cost model estimates fastest, and at
the DeepSeek-V3 dense shapes, the MoE (ragged, masked) shapes and the training
recipe's shapes it is the config the rules measured on the H100 picked (frozen
from commit 737fe5c, the last of the rules, and changed since only where a
measurement says so, as noted; `python tools/tiling_picks.py` compares any two
revisions over these and wider shape sets).
"""
import dataclasses
import itertools
import math
import re

import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from jax_fp8.pallas import hopper, hopper_cost, hopper_tiling, scheduler

BF16, F32 = np.dtype(jnp.bfloat16), np.dtype(jnp.float32)
FP8 = np.dtype(jnp.float8_e4m3fn)
OUT_C = {"bf16": (BF16, None), "bf16+cf32": (BF16, F32), "bf16+cbf16": (BF16, BF16),
         "f32": (F32, None), "f32+cf32": (F32, F32), "f32+cbf16": (F32, BF16)}

# Chained per-tile pipelines: 2 stages dividing the K blocks, several tiles per CTA.
CHAIN = hopper.HopperConfig(tile_m=64, tile_n=64, wg_split="n", stages=2, num_sms=2,
                            epi_tile_n=32)
CHAIN_3 = hopper.HopperConfig(tile_m=128, tile_n=128, wg_split="m", stages=3, num_sms=2)
THREE_WG = hopper.HopperConfig(tile_m=192, tile_n=128, wg_split="m", consumers=3, stages=2,
                               num_sms=2)


@pytest.fixture(autouse=True)
def h100(monkeypatch):
  monkeypatch.setattr(hopper, "num_sms", lambda: 132)


def _kind(kind: str) -> dict:
  if kind.startswith("ragged x"):
    return dict(groups=int(kind[len("ragged x"):]), grouped=True, row_masks=True)
  if kind.startswith("masked x"):
    return dict(groups=int(kind[len("masked x"):]), grouped=True)
  if kind == "per-row b":
    return dict(b_scale_rows=1)
  assert kind == "", kind
  return {}


def _config(spec: str) -> hopper.HopperConfig:
  """A config from tools/tiling_picks.py's short form, e.g.
  "128x64m2 s3 e32 om ks2 sk4 cn2 p72 sep"."""
  tile, *fields = spec.split()
  tm, tn, split, consumers = re.fullmatch(r"(\d+)x(\d+)([mnk])(\d)", tile).groups()
  cfg = dict(tile_m=int(tm), tile_n=int(tn), wg_split=split, consumers=int(consumers))
  names = {"s": "stages", "e": "epi_tile_n", "ks": "k_step", "sk": "split_k",
           "cm": "cluster_m", "cn": "cluster_n", "p": "producer_registers",
           "aw": "a_scale_window"}
  for f in fields:
    if f == "sep":
      cfg["scale_product"] = False
    elif f == "wide":
      cfg["wide_chunks"] = True
    elif f == "tma":
      cfg["tma_scales"] = True
    elif f == "lf":
      cfg["live_first"] = True
    elif f == "ov":
      cfg["step_top_overlap"] = True
    elif f == "dc":
      cfg["desc_carry"] = True
    elif f == "cs":
      cfg["carried_slot"] = True
    elif f == "pw":
      cfg["producer_warp"] = True
    elif f == "pf":
      cfg["probe_in_flight"] = True
    elif f[0] == "o":
      cfg["grid_minor"] = f[1:]
    else:
      name, value = re.fullmatch(r"([a-z]+)(\d+)", f).groups()
      cfg[names[name]] = int(value)
  return hopper.HopperConfig(**cfg)


# (m, n, k, kind, {picked config: the out/c variants it is picked for ("*": all
# six of OUT_C; the MoE and training shapes: bf16 or f32 out, no c)}).
FROZEN_PICKS = [
    # decode tiles whose warpgroups split K ("k") at K >= 4096 in one wave since
    # 2026-11-27 14:40 (H100: 1.02-1.14x the K splits across CTAs they replace)
    (64, 2112, 7168, '', {'64x16k3 s9 e16 om ks2 sep': '*'}),
    (64, 24576, 1536, '', {'64x192n3 s2 e64 om ks2 sep': 'bf16 bf16+cbf16',
                           '64x192n3 s2 e32 om ks2 sep': 'bf16+cf32 f32 f32+cf32 f32+cbf16'}),
    (64, 32768, 512, '', {'64x256n2 s3 e128 om sep': 'bf16',
                          '64x256n2 s3 e64 om sep': 'bf16+cf32 bf16+cbf16 f32',
                          '64x256n2 s3 e32 om sep': 'f32+cf32 f32+cbf16'}),
    (64, 7168, 16384, '', {'64x64k2 s4 e64 om ks2 sep': 'bf16 bf16+cf32 bf16+cbf16',
                           '64x64k2 s4 e32 om ks2 sep': 'f32 f32+cf32 f32+cbf16'}),
    (64, 4096, 7168, '', {'64x32k3 s6 e32 om ks2 sep': '*'}),
    (64, 7168, 2048, '', {'64x64n2 s4 e32 om ks2 sep': '*'}),
    (128, 2112, 7168, '', {'64x32k3 s6 e32 om ks2 sep': '*'}),
    (128, 24576, 1536, '', {'128x64m2 s3 e64 om ks2 sep': 'bf16 bf16+cf32 bf16+cbf16',
                            '128x64m2 s3 e32 om ks2 sep': 'f32 f32+cf32 f32+cbf16'}),
    (128, 32768, 512, '', {'128x256n2 s3 e128 om p72 sep': 'bf16',
                           '128x256n2 s2 e64 om p72 sep': 'bf16+cf32',
                           '128x256n2 s3 e64 om p72 sep': 'bf16+cbf16 f32',
                           '128x256n2 s3 e32 om p72 sep': 'f32+cf32 f32+cbf16'}),
    (128, 7168, 16384, '', {'128x64m2 s4 e64 om ks2 cn2 sep': 'bf16',
                            '128x64m2 s3 e64 om ks2 cn2 sep': 'bf16+cf32 bf16+cbf16',
                            '128x64m2 s4 e32 om ks2 cn2 sep': 'f32',
                            '128x64m2 s3 e32 om ks2 cn2 sep': 'f32+cf32 f32+cbf16'}),
    (128, 4096, 7168, '', {'64x64k2 s4 e64 om ks2 sep': 'bf16 bf16+cf32 bf16+cbf16',
                           '64x64k2 s4 e32 om ks2 sep': 'f32 f32+cf32 f32+cbf16'}),
    (128, 7168, 2048, '', {'128x64m2 s3 e64 om ks2 sep': 'bf16 bf16+cf32 bf16+cbf16',
                           '128x64m2 s3 e32 om ks2 sep': 'f32 f32+cf32 f32+cbf16'}),
    # wide 128 x 192 tiles since 2026-11-23 22:48 (H100: 1081 -> 1150 TFLOP/s at bf16)
    # a-scales staged in SMEM by 4-step windows since 2026-11-26 (H200: +2.3%)
    # from M = 2048 every slot's scales come by the ring's TMA ("tma") since 2026-11-26
    # (H100: +1-5% at the M = 2048 / 4096 shapes, per-row b scales +7-14%)
    # a ring one stage past RING_BYTES (4 stages) where it fits since 2026-11-26 (H100: +2.2-2.4%)
    # dense tilings with the scales in the ring overlap their step top ("ov") since
    # 2026-11-27 (H100: +0.2-1.4%), 128 x 256 ones with a bf16 output and no residual
    # since 2026-11-27 10:30 (+0.5-0.9%, their 12 spilled bytes outside the K loop; with
    # a float32 output or a residual 0.4-1.4% slower); 192 x 128 tiles of three consumers
    # in 4 stages with carried descriptors since 2026-11-28 ~17:40 (H200: +2.2-2.6%)
    # where no residual's ring takes their fourth stage; one producer warp ("pw") in
    # one-chunk tiles since 2026-11-29 ~07:00 (H200: +1.1-2.1%), 192 x 128 ones over
    # short K loops too since 2026-11-29 ~09:20 (+1.7% at 4096x32768x512); two-consumer
    # tiles test the next slot's barrier while the last WGMMA runs ("pf") since
    # 2026-11-29 ~11:10 (H200: +0.2-1.5%)
    (4096, 2112, 7168, '', {'192x128m3 s4 e64 on tma ov dc pw': 'bf16',
                            '128x192m2 s4 e64 on wide tma ov dc pw pf': 'bf16+cbf16',
                            '128x192m2 s3 e64 on wide tma ov dc pw pf': 'bf16+cf32',
                            '192x128m3 s4 e32 on tma ov dc pw': 'f32',
                            '128x192m2 s4 e32 on wide tma ov dc pw pf': 'f32+cbf16',
                            '128x192m2 s3 e32 on wide tma ov dc pw pf': 'f32+cf32'}),
    (4096, 24576, 1536, '', {'128x256n2 s3 e128 on p72 tma ov pw pf': 'bf16',
                             '128x256n2 s2 e64 on p72 tma pw': 'bf16+cf32',
                             '128x256n2 s3 e64 on p72 tma pw': 'bf16+cbf16',
                             '128x256n2 s3 e64 on p72 tma': 'f32',
                             '128x256n2 s3 e32 on p72 tma': 'f32+cf32 f32+cbf16'}),
    (4096, 32768, 512, '', {'192x128m3 s4 e128 on tma ov pw': 'bf16',
                            '192x128m3 s2 e32 on tma ov pw': 'bf16+cf32',
                            '128x256n2 s3 e64 on p72 tma': 'bf16+cbf16 f32',
                            '128x256n2 s3 e32 on p72 tma': 'f32+cf32 f32+cbf16'}),
    # 256 x 128 tiles in pairs sharing A over long K loops since 2026-11-27 (H100:
    # +0.9-3.0% at 4096-16384 rows)
    (4096, 7168, 16384, '', {'256x128m2 s3 e64 on cn2 p72 tma ov dc pw pf': 'bf16 bf16+cbf16',
                             '128x256n2 s2 e64 on p72 tma pw': 'bf16+cf32',
                             '256x128m2 s3 e32 on cn2 p72 tma ov dc pw pf': 'f32 f32+cf32 f32+cbf16'}),
    (4096, 4096, 7168, '', {'256x128m2 s3 e64 on cn2 p72 tma ov dc pf': 'bf16 bf16+cbf16',
                            '128x256n2 s2 e64 on p72 tma pw': 'bf16+cf32',
                            '256x128m2 s3 e32 on cn2 p72 tma ov dc pf': 'f32 f32+cf32 f32+cbf16'}),
    (4096, 7168, 2048, '', {'128x256n2 s3 e128 on p72 tma ov pw pf': 'bf16',
                            '128x256n2 s2 e64 on p72 tma pw': 'bf16+cf32',
                            '128x256n2 s3 e64 on p72 tma pw': 'bf16+cbf16',
                            '128x256n2 s3 e64 on p72 tma': 'f32',
                            '128x256n2 s3 e32 on p72 tma': 'f32+cf32 f32+cbf16'}),
    # wide 128 x 192 tiles since 2026-11-23 22:48 (H100: 1142 -> 1197 TFLOP/s at bf16);
    # the scales read once the first WGMMA is issued since 2026-11-27 (+0.3-1.0%); the
    # ring slot and the WGMMA descriptors carried since 2026-11-28 ~17:30 (H200: 1.00-1.025x
    # the 256 x 128 tiles a rule took from ~14:48)
    (32768, 4096, 7168, 'ragged x8', {'128x192m2 s3 e64 on wide tma ov dc cs pw pf': 'bf16',
                                      '128x192m2 s3 e32 on wide tma ov dc cs pw pf': 'f32'}),
    # groups of >= 8192 rows on average over long K loops: 192 x 128 tiles of three
    # consumers since 2026-11-28 ~22:10 (H200: 1.021-1.026x at 1-4 groups)
    (32768, 4096, 7168, 'ragged x4', {'192x128m3 s3 e64 on tma ov dc cs pw': 'bf16',
                                      '192x128m3 s3 e32 on tma ov dc cs pw': 'f32'}),
    # masked at large M since 2026-11-26: tiles of one chunk row per warpgroup
    # (128 x 256 ran 2.8-4x slower at K=7168), estimated over fills of M; 128 x 160
    # walked live-first since 2026-11-26 14:00 (4 x 256: 83.2 -> 70.2 us, H100); 192 x 128
    # in 4 stages with the scales in the ring since 2026-11-28 ~19:50 (H200: 1.025-1.03x),
    # walked live-first since 2026-11-29 (H200: 1.09-1.45x on the mean of random fills)
    (1024, 4096, 7168, 'masked x1', {'192x128m3 s4 e64 on tma ov dc lf pw': 'bf16',
                                     '192x128m3 s4 e32 on tma ov dc lf pw': 'f32'}),
    (512, 4096, 7168, 'masked x2', {'192x128m3 s4 e64 om tma ov dc lf pw': 'bf16',
                                    '192x128m3 s4 e32 om tma ov dc lf pw': 'f32'}),
    # 128 x 160 over long K loops in 5 stages since 2026-11-28 ~22:30 (H200: 1.009-1.013x)
    (256, 4096, 7168, 'masked x4', {'128x160m2 s5 e32 om wide lf dc pw': 'bf16 f32'}),
    (64, 4096, 7168, 'masked x32', {'64x256n2 s3 e64 om sep': 'bf16',
                                    '64x256n2 s3 e32 om sep': 'f32'}),
    # 2026-11-26: 128 x 256 split by columns (192 x 128 before), 0.4-2.9% faster
    (32768, 7168, 2048, 'ragged x4', {'128x256n2 s3 e64 on p72 tma': 'bf16',
                                   '128x256n2 s3 e32 on p72 tma': 'f32'}),
    # 2026-11-29: a ring of 4 (3 before) over 16 K blocks, 1.018x at 1 x ~1024
    (1024, 7168, 2048, 'masked x1', {'192x128m3 s4 e64 on dc pw lf': 'bf16',
                                     '192x128m3 s4 e32 on dc pw lf': 'f32'}),
    (512, 7168, 2048, 'masked x2', {'128x160m2 s4 e32 om wide lf dc pw': 'bf16 f32'}),
    (256, 7168, 2048, 'masked x4', {'128x160m2 s4 e32 om wide lf dc pw': 'bf16 f32'}),
    (64, 7168, 2048, 'masked x32', {'64x256n2 s3 e128 om sep': 'bf16',
                                    '64x256n2 s3 e64 om sep': 'f32'}),
    # per-row b: warpgroups one above the other since the scales came by TMA (+13%),
    # a 5-deep ring (+3-8%); 128 x 160 since 2026-11-29 (H200, f32 out: 1.004-1.067x)
    (7168, 18432, 4096, 'per-row b', {'128x160m2 s5 e32 on wide tma pw': 'bf16 f32'}),
    (7168, 18432, 16384, 'per-row b', {'128x160m2 s5 e32 on wide tma pw': 'bf16 f32'}),
    (18432, 7168, 4096, 'per-row b', {'128x160m2 s5 e32 on wide tma pw': 'bf16 f32'}),
    (18432, 7168, 16384, 'per-row b', {'128x160m2 s5 e32 on wide tma pw': 'bf16 f32'}),
    (4096, 18432, 7168, '', {'256x128m2 s3 e64 on cn2 p72 tma ov dc pw pf': 'bf16',
                             '256x128m2 s3 e32 on cn2 p72 tma ov dc pw pf': 'f32'}),
    (4096, 7168, 18432, '', {'256x128m2 s3 e64 on cn2 p72 tma ov dc pw pf': 'bf16',
                             '256x128m2 s3 e32 on cn2 p72 tma ov dc pw pf': 'f32'}),
    (16384, 18432, 7168, '', {'256x128m2 s3 e64 on cn2 p72 tma ov dc pw pf': 'bf16',
                              '256x128m2 s3 e32 on cn2 p72 tma ov dc pw pf': 'f32'}),
    (16384, 7168, 18432, '', {'256x128m2 s3 e64 on cn2 p72 tma ov dc pw pf': 'bf16',
                              '256x128m2 s3 e32 on cn2 p72 tma ov dc pw pf': 'f32'}),
]


def _frozen_cases():
  for m, n, k, kind, picks in FROZEN_PICKS:
    for spec, variants in picks.items():
      for variant in (OUT_C if variants == "*" else variants.split()):
        out_dtype, c_dtype = OUT_C[variant]
        yield m, n, k, dict(_kind(kind), out_dtype=out_dtype, c_dtype=c_dtype), spec


def test_frozen_picks():
  cases = list(_frozen_cases())
  assert len(cases) == 18 * 6 + 2 * 2 * 5 + 8 + 8 + 2
  wrong = []
  for m, n, k, kw, spec in cases:
    got = hopper_tiling.default_config(m, n, k, **kw)
    if got != _config(spec):
      wrong.append(f"{m}x{n}x{k} {kw}: {got} (frozen: {spec})")
  assert not wrong, "\n".join(wrong)


def _shapes():
  """The frozen shapes and a grid of others (odd sizes included)."""
  for m, n, k, kw, _ in _frozen_cases():
    yield m, n, k, kw
  for m, n, k in itertools.product((1, 65, 129, 1000, 4097), (136, 2112, 7000, 24576),
                                   (128, 384, 1000, 4096, 16384)):
    for kw in (dict(out_dtype=BF16), dict(out_dtype=F32, c_dtype=F32),
               dict(out_dtype=F32, b_scale_rows=1), dict(out_dtype=BF16, groups=4, grouped=True),
               dict(out_dtype=BF16, grouped=True, row_masks=True)):
      yield m, n, k, kw


def test_default_is_the_cheapest_candidate():
  for m, n, k, kw in _shapes():
    row_masks = kw.get("row_masks", False)

    def estimate(cfg):
      return hopper_cost.estimated_time_us(
          cfg, m, n, k, kw.get("groups", 1), b_scale_rows=kw.get("b_scale_rows", 128),
          row_masks=row_masks, masked=kw.get("grouped", False) and not row_masks)
    cands = hopper_tiling.candidate_configs(m, n, k, **kw)
    default = hopper_tiling.default_config(m, n, k, **kw)
    assert default in cands and cands[0] == default, (m, n, k, kw)
    cost = [estimate(c) for c in cands]
    assert cands[0] == min(cands, key=estimate)
    assert cost == sorted(cost) and math.isfinite(cost[0]), (m, n, k, kw)


def test_candidates_build_fit_and_say_why_unmodelled():
  for m, n, k, kw in _shapes():
    out_dtype, c_dtype = kw["out_dtype"], kw.get("c_dtype")
    cands = hopper_tiling.candidate_configs(m, n, k, **kw)
    assert len(cands) == len(set(cands)) >= 2, (m, n, k, kw)
    for cfg in cands:
      cfg.check()
      assert cfg.smem_bytes(out_dtype, c_dtype) <= hopper_tiling.SMEM_BYTES, (m, n, k, cfg)
      assert m > 64 or cfg.tile_m == 64  # decode never wastes a 128-row tile
      # Decode multiplies the scales at promotion, and so do the narrow one-chunk
      # tiles of one wave between decode and large M; large M carries their product.
      if m <= hopper_cost.DECODE_MAX_M:
        assert not cfg.scale_product
      elif not hopper_cost.in_mid_m_form(cfg):
        assert cfg.scale_product
      problem = dict(b_scale_rows=kw.get("b_scale_rows", 128),
                     row_masks=kw.get("row_masks", False))
      why = hopper_cost.unmodelled(cfg, m, n, k, kw.get("groups", 1), **problem)
      estimate = hopper_cost.estimated_time_us(cfg, m, n, k, kw.get("groups", 1), **problem)
      assert math.isinf(estimate) == (why is not None), (m, n, k, cfg, why)
      if kw.get("grouped"):
        assert cfg.split_k == 1 and cfg.cluster_m == cfg.cluster_n == 1
      if m > hopper_cost.DECODE_MAX_M and (kw.get("b_scale_rows") == 1 or kw.get("row_masks")):
        # Per-row b scales and ragged groups: only the tiles of their own tables.
        table = hopper_cost.large_m_tiles(k, b_scale_rows=kw.get("b_scale_rows", 128),
                                          row_masks=kw.get("row_masks", False))
        assert hopper_cost.tile_key(cfg) in table, (m, n, k, kw, cfg)


def test_autotuning_keeps_the_forms_it_tried():
  # What autotuning timed before the cost model: pairs sharing B, rings one
  # deeper, the tiles without measurements, K splits of other tiles.
  decode = hopper_tiling.candidate_configs(128, 2112, 7168)
  assert any(c.cluster_m == 2 and c.k_step == 2 for c in decode)
  assert any(c.tile_m == c.tile_n == 128 for c in decode)
  assert any(c.split_k == 4 and c.tile_n == 128 for c in decode)
  large = hopper_tiling.candidate_configs(4096, 7168, 2048)
  for tm, tn, split in ((64, 256, "n"), (256, 128, "m"), (128, 128, "n")):
    assert any((c.tile_m, c.tile_n, c.wg_split) == (tm, tn, split) for c in large)
  assert any(c.tile_m == 128 and c.tile_n == 128 and c.stages == 5 for c in large)


def test_cost_model_terms():
  est = hopper_cost.estimated_time_us
  # Two-block steps pay from 12 K blocks (the step boundary saved outweighs the
  # longer first wait).
  assert hopper_cost.two_block_steps_pay(12) and not hopper_cost.two_block_steps_pay(11)
  # Chained decode tiles cost less than the same tiles unchained.
  cfg = hopper.HopperConfig(tile_m=128, tile_n=64, wg_split="m", stages=3, k_step=2,
                            grid_minor="m", scale_product=False)
  assert hopper_cost.chains_tiles(cfg, 128, 24576, 1536)
  assert est(cfg, 128, 24576, 1536) < 3 * est(cfg, 128, 8192, 1536)
  # K splits: estimated only for 64-column tiles of all rows, in one wave, from
  # 32 K blocks; they win there over the unsplit tiles and lose below.
  split = hopper_tiling.default_config(64, 2112, 16384)
  assert split.split_k == 4 and hopper_tiling.default_config(64, 2112, 2048).split_k == 1
  assert hopper_cost.unmodelled(dataclasses.replace(split, split_k=4), 64, 2112, 3584)
  assert hopper_cost.unmodelled(split, 64, 7168, 4096)  # 448 units: several waves
  # ... and among a CTA's warpgroups: dense, one wave, from 32 K blocks; its ring a
  # multiple of the warpgroups, held to RING_BYTES, not to 8 one-block stages.
  ksplit = hopper_tiling.default_config(64, 2112, 7168)
  assert (ksplit.wg_split, ksplit.tile_n, ksplit.stages, ksplit.k_step) == ("k", 16, 9, 2)
  assert hopper_cost.unmodelled(ksplit, 64, 2112, 3584)               # 28 K blocks
  assert hopper_cost.unmodelled(ksplit, 64, 4224, 7168)               # 264 units
  assert hopper_cost.unmodelled(ksplit, 64, 2112, 7168, masked=True)
  assert not hopper_cost.unmodelled(ksplit, 64, 2112, 4096)
  # Pairs sharing A: in one wave, and over several waves only over >= 32 K blocks.
  pair = hopper_tiling.default_config(128, 7168, 16384)
  assert pair.cluster_n == 2 and not hopper_cost.unmodelled(pair, 128, 24576, 16384)
  assert hopper_cost.unmodelled(pair, 128, 24576, 2048)
  assert hopper_tiling.default_config(128, 7168, 7168).cluster_n == 1
  # The 4-deep ring of 128 x 256 tiles with their scales from GMEM: faster than 3
  # stages where it chains over >= 64 K blocks, slower at 56; with the scales in
  # the ring (tma_scales, from M = 2048) 3 stages.
  three = dataclasses.replace(hopper_tiling.default_config(4096, 7168, 2048), epi_tile_n=64)
  assert (three.tile_m, three.tile_n, three.stages, three.tma_scales) == (128, 256, 3, True)
  assert est(dataclasses.replace(three, stages=4), 4096, 7168, 16384) > est(three, 4096, 7168,
                                                                             16384)
  three = dataclasses.replace(three, tma_scales=False, step_top_overlap=False,
                              probe_in_flight=False)
  deep = dataclasses.replace(three, stages=4)
  assert est(deep, 4096, 7168, 16384) < est(three, 4096, 7168, 16384)
  assert est(deep, 4096, 4096, 7168) > est(three, 4096, 4096, 7168)
  assert hopper_tiling.default_config(384, 32768, 16384).stages == 4  # (no tma_scales)
  # Per-row b scales in the ring: 128 x 160 tiles (wide chunks) 5 deep (past
  # RING_BYTES), and so 128 x 128 ones where they win; 4 with the scales from GMEM,
  # where 128 x 160 tiles are not modelled (not measured so).
  per_row = hopper_tiling.default_config(7168, 18432, 4096, b_scale_rows=1)
  assert (per_row.tile_m, per_row.tile_n, per_row.stages, per_row.tma_scales,
          per_row.wide_chunks) == (128, 160, 5, True, True)
  narrow = dataclasses.replace(per_row, tile_n=128, wide_chunks=False)
  assert est(dataclasses.replace(narrow, stages=4), 7168, 7168, 4096, b_scale_rows=1) > est(
      narrow, 7168, 7168, 4096, b_scale_rows=1)
  gmem = hopper_tiling.default_config(1024, 18432, 4096, b_scale_rows=1)
  assert (gmem.tile_n, gmem.stages, gmem.tma_scales) == (128, 4, False)
  assert "GMEM" in hopper_cost.unmodelled(dataclasses.replace(per_row, tma_scales=False),
                                          1024, 18432, 4096, b_scale_rows=1)
  # Tiles the model has no measurement for are left to autotuning.
  odd = hopper.HopperConfig(tile_m=256, tile_n=128, wg_split="m")
  assert "measurement" in hopper_cost.unmodelled(odd, 4096, 4096, 4096)
  assert math.isinf(est(odd, 4096, 4096, 4096))
  # ... but 256 x 128 tiles in pairs sharing A are modelled where measured: the
  # scales in the ring (M >= 2048), K loops of >= 24 blocks; there they win over
  # 128 x 256 tiles of the same waves.
  paired = hopper_tiling.default_config(4096, 4096, 7168)
  assert (paired.tile_m, paired.tile_n, paired.wg_split, paired.cluster_n) == (256, 128, "m", 2)
  assert paired.producer_registers == 72 and paired.tma_scales
  assert est(paired, 4096, 4096, 3072) < est(three, 4096, 4096, 3072)
  assert hopper_cost.unmodelled(paired, 4096, 7168, 2048)  # 16 K blocks
  assert hopper_cost.unmodelled(
      dataclasses.replace(paired, tma_scales=False, step_top_overlap=False,
                          probe_in_flight=False), 4096, 4096, 7168)
  assert hopper_tiling.default_config(1024, 18432, 7168).cluster_n == 1
  assert hopper_tiling.default_config(4096, 7168, 2048).cluster_n == 1
  # ... nor where a float32 c leaves the ring 2 stages
  assert hopper_tiling.default_config(4096, 4096, 7168, c_dtype=F32).cluster_n == 1
  # Grouped GEMMs and per-row b scales keep their own tables (no pairs).
  for kw in (dict(grouped=True, row_masks=True), dict(groups=2, grouped=True),
             dict(b_scale_rows=1)):
    assert hopper_tiling.default_config(4096, 4096, 7168, **kw).cluster_n == 1


def test_default_config_rules():
  # Decode shapes take 64-row tiles (a 128-row tile would be mostly padding).
  for n, k in ((2112, 7168), (24576, 1536), (7168, 2048)):
    assert hopper_tiling.default_config(1, n, k).tile_m == 64
    assert hopper_tiling.default_config(64, n, k).tile_m == 64
  big = hopper_tiling.default_config(4096, 7168, 2048)
  assert (big.tile_m, big.tile_n, big.consumers) == (128, 256, 2)
  # Two 64 x 128 chunks per consumer: the producer keeps more registers so that
  # ptxas's allocation of the consumers' K loop does not spill.
  assert big.producer_registers == 72
  assert hopper_tiling.default_config(64, 7168, 2048).producer_registers == 40
  # Long K loops, scales from GMEM (M < 2048): a 4-deep ring that divides the K
  # blocks, chained; not at K=7168.
  long_k = hopper_tiling.default_config(384, 32768, 16384)
  assert long_k.stages == 4 and hopper_tiling.chains_tiles(long_k, 384, 32768, 16384)
  assert hopper_tiling.default_config(384, 32768, 7168).stages == 3
  # From M = 2048 (not masked, one-block steps) every slot's scales come by TMA; below,
  # only the 256 x 128 tiles from M = 512 (SCALED_RING_TILES, test_scaled_ring_tiles).
  assert hopper_tiling.default_config(2048, 4096, 7168).tma_scales
  assert not hopper_tiling.default_config(384, 32768, 7168).tma_scales
  assert not hopper_tiling.default_config(1024, 7168, 2048).tma_scales
  # (masked: only the 192 x 128 tiles in their deeper ring, test_three_consumer_tiles_...)
  assert not hopper_tiling.default_config(4096, 4096, 2048, groups=2, grouped=True).tma_scales
  assert hopper_tiling.default_config(4096, 4096, 7168, grouped=True, row_masks=True).tma_scales
  # Narrow N at large M: 128 x 192 tiles of one wide 64 x 192 WGMMA chunk per
  # warpgroup fill the waves (3 of them, where 128 x 128 tiles need 4.1); over long
  # K loops three consumers' 192 x 128 tiles in a deeper ring run ahead of them (also
  # 3 waves: test_three_consumer_tiles_over_long_k_loops); the producer keeps 40.
  narrow = hopper_tiling.default_config(4096, 2112, 2048)
  assert (narrow.tile_m, narrow.tile_n, narrow.consumers) == (128, 192, 2)
  assert narrow.wide_chunks and narrow.producer_registers == 40 and narrow.chunk() == (64, 192)
  # ... whose 64-column parts an FP8 output (one 1x128 group a piece) cannot take:
  # there the next candidate, 192 x 128 of three consumers, not the decode fallback.
  fp8_narrow = hopper_tiling.fp8_output_config(4096, 2112, 7168)
  assert (fp8_narrow.tile_m, fp8_narrow.tile_n, fp8_narrow.consumers) == (192, 128, 3)
  assert fp8_narrow.piece_n() == fp8_narrow.epi_tile_n == 128
  # An FP8 output takes the long-K pairs sharing A from N = 7168 (at N = 4096 they
  # ran behind 128 x 256 tiles there).
  fp8_pairs = hopper_tiling.fp8_output_config(4096, 18432, 7168)
  assert (fp8_pairs.tile_m, fp8_pairs.cluster_n, fp8_pairs.epi_tile_n) == (256, 2, 128)
  fp8_no_pairs = hopper_tiling.fp8_output_config(4096, 4096, 7168)
  assert (fp8_no_pairs.tile_m, fp8_no_pairs.tile_n, fp8_no_pairs.cluster_n) == (128, 256, 1)
  assert hopper_tiling.default_config(4096, 4096, 7168).cluster_n == 2
  # At decode an FP8 output (no K split across CTAs) takes 64 x 128 tiles whose two
  # warpgroups split K where they fit one wave; elsewhere 64 x 256 / 128 x 128 tiles.
  for m, n, k in ((64, 2112, 7168), (128, 4096, 7168), (128, 7168, 2048), (1, 7168, 16384)):
    fp8 = hopper_tiling.fp8_output_config(m, n, k)
    assert (fp8.tile_m, fp8.tile_n, fp8.wg_split, fp8.k_step, fp8.stages) == (
        64, 128, "k", 1, 6), (m, n, k, fp8)
    assert fp8.piece_n() == fp8.epi_tile_n == 128
  assert hopper_tiling.fp8_output_config(64, 24576, 1536).tile_n == 256
  assert hopper_tiling.fp8_output_config(128, 24576, 1536).tile_n == 128
  # ... and where those (up to 1024 rows, over >= 32 K blocks) fill their waves' CTAs
  # to at most 55%, the float32 output of the bf16 rules' tiling is quantised after the
  # GEMM instead (sm90.py): 34-68 128 x 128 tiles at 200-512 rows, 1024x2112x7168's 136
  # (two waves, the second of 4 CTAs).
  after = lambda m, n, k, **kw: hopper_tiling.fp8_output_quantized_after(m, n, k, num_sms=132,
                                                                          **kw)
  for m, n, k in ((64, 2112, 7168), (128, 2112, 7168), (64, 4096, 7168), (128, 4096, 7168),
                  (64, 7168, 16384), (1, 7168, 18432), (192, 2112, 7168), (256, 2112, 7168),
                  (192, 2112, 16384), (512, 2112, 7168), (1024, 2112, 7168)):
    assert after(m, n, k), (m, n, k)
  # Above decode, the decode FP8 tiles (64 x 128, warpgroups splitting K) where they fit
  # one wave and the model puts them ahead of quantising after (hopper_cost.
  # FP8_K_SPLIT_FIXED_US; measured 1.08-1.71x at 21 of the 27 shapes they take).
  for m, n, k in ((384, 2112, 7168), (320, 2112, 4096), (256, 4096, 7168), (200, 2112, 7168),
                  (300, 2112, 7168), (448, 2048, 7168), (1000, 1024, 4096), (256, 4096, 16384),
                  (129, 4096, 16384)):
    assert not after(m, n, k), (m, n, k)
    fp8 = hopper_tiling.fp8_output_config(m, n, k)
    assert (fp8.tile_m, fp8.tile_n, fp8.wg_split, fp8.k_step, fp8.stages, fp8.scale_product,
            fp8.epi_tile_n) == (64, 128, "k", 1, 6, False, 128), (m, n, k, fp8)
    assert hopper_cost.units(fp8, m, n) <= 132
  # ... not where they would take two waves, nor without 128 x 128 b scales.
  assert hopper_tiling.fp8_output_config(512, 2112, 7168).tile_m == 128  # 136 of them
  assert not hopper_tiling._fp8_mid_k_split(384, 2112, 7168, 1, num_sms=132)
  for m, n, k in ((128, 7168, 16384), (64, 7168, 2048), (128, 7168, 2048), (64, 24576, 1536),
                  (128, 32768, 512), (128, 36864, 7168), (384, 4096, 7168), (640, 2112, 7168),
                  (512, 4096, 7168), (256, 7168, 16384), (256, 2112, 2048), (2048, 2112, 7168)):
    assert not after(m, n, k), (m, n, k)
  assert not after(64, 2112, 7168, b_scale_rows=1)  # measured with 128 x 128 b scales only
  # A GLU at decode over long K runs unfused (the gate|up GEMM's tiles fill the
  # waves where the fused 256-row tiles leave a tail); from 128 rows, or over short
  # K loops, fused.
  assert hopper_tiling.glu_unfused(64, 18432, 7168) and hopper_tiling.glu_unfused(1, 2048, 4096)
  assert hopper_tiling.glu_unfused(128, 18432, 7168)
  assert not hopper_tiling.glu_unfused(256, 18432, 7168)
  assert not hopper_tiling.glu_unfused(64, 18432, 2048)
  # Decode GEMMs of 128 rows over long K and several waves: 128 x 64 tiles in pairs
  # sharing A (the gate|up GEMM of a DeepSeek-V3 MLP at 128 tokens among them).
  for n, k in ((18432, 7168), (36864, 7168), (36864, 4096), (24576, 7168)):
    pairs = hopper_tiling.default_config(128, n, k)
    assert (pairs.tile_m, pairs.tile_n, pairs.cluster_n) == (128, 64, 2), (n, k, pairs)
  assert hopper_tiling.default_config(128, 24576, 1536).cluster_n == 1
  # Between 64 and 128 rows (a partial second row tile), over several waves: 64-row
  # tiles of 128 columns, not 64.
  for m in (65, 96, 127):
    part = hopper_tiling.default_config(m, 36864, 7168)
    assert (part.tile_m, part.tile_n) == (64, 128), (m, part)
  assert hopper_tiling.default_config(64, 36864, 7168).tile_n == 64
  assert hopper_tiling.default_config(64, 36864, 7168).tile_m == 64
  # Short K loops at large M: chained 192 x 128 tiles, the ring as deep as the loop.
  short = hopper_tiling.default_config(4096, 32768, 512)
  assert (short.tile_m, short.consumers, short.stages) == (192, 3, 4)
  assert hopper_tiling.chains_tiles(short, 4096, 32768, 512)
  # ... but not where 192-row tiles would be a third padding.
  assert hopper_tiling.default_config(256, 32768, 512).tile_m != 192
  # Autotuning may try three consumer warpgroups (192 x 128 tiles) at large M.
  assert any(c.consumers == 3 for c in hopper_tiling.candidate_configs(4096, 2112, 7168))
  # Where tilings tie on waves, the one whose tiles chain (128 x 64: 3 per CTA, a
  # 6-deep ring dividing the 12 K blocks) over one wave of unchained 128 x 256.
  mid = hopper_tiling.default_config(128, 24576, 1536)
  assert (mid.tile_m, mid.tile_n) == (128, 64) and hopper_tiling.chains_tiles(mid, 128, 24576, 1536)
  # One wave of 64 x 192 tiles (three consumers) where 256-wide tiles leave a quarter
  # of the SMs idle; for M > 64 not over several waves (two 64-row tiles per B tile).
  wide = hopper_tiling.default_config(64, 24576, 1536)
  assert (wide.tile_m, wide.tile_n, wide.consumers, wide.k_step) == (64, 192, 3, 2)
  assert hopper_tiling.default_config(128, 12288, 1536).consumers == 3
  assert hopper_tiling.default_config(128, 24576, 512).consumers == 2
  assert any(c.consumers == 3 for c in hopper_tiling.candidate_configs(64, 24576, 1536))
  # Narrow N at small M: tiles (x K splits) enough to give most of the 132 SMs work.
  for m, n, k in ((64, 2112, 7168), (128, 2112, 7168), (128, 4096, 7168), (64, 4096, 7168),
                  (64, 2112, 2048), (128, 7168, 16384)):
    cfg = hopper_tiling.default_config(m, n, k)
    tiles = pl.cdiv(m, cfg.tile_m) * pl.cdiv(n, cfg.tile_n) * cfg.split_k
    assert 64 <= tiles <= 132, (m, n, k, cfg)
  # ... by splitting K where it is long: among a CTA's warpgroups (no partial outputs)
  # where such tiles fill one wave, else across CTAs in 64-column tiles of all M rows.
  for m, n, k, split_k in ((1, 2112, 16384, 4), (100, 4096, 16384, 2)):
    cfg = hopper_tiling.default_config(m, n, k)
    assert (cfg.tile_m, cfg.tile_n, cfg.split_k) == (64 if m <= 64 else 128, 64, split_k), (
        m, n, k, cfg)
  for m, n, k, tile in ((128, 2112, 7168, (64, 32, 3)), (64, 4096, 7168, (64, 32, 3)),
                        (64, 2112, 7168, (64, 16, 3)), (1, 2112, 4096, (64, 16, 3)),
                        (128, 4096, 7168, (64, 64, 2)), (64, 7168, 16384, (64, 64, 2))):
    cfg = hopper_tiling.default_config(m, n, k)
    assert (cfg.tile_m, cfg.tile_n, cfg.consumers, cfg.wg_split, cfg.split_k) == (
        *tile, "k", 1), (m, n, k, cfg)
    assert cfg.stages % cfg.consumers == 0
  # Not over short K loops (measured slower at K = 2048), several waves or grouped GEMMs.
  for m, n, k, kw in ((64, 7168, 2048, {}), (128, 7168, 16384, {}),
                      (64, 4096, 7168, dict(groups=32, grouped=True)),
                      (64, 4096, 7168, dict(grouped=True, row_masks=True))):
    assert hopper_tiling.default_config(m, n, k, **kw).wg_split != "k"
  assert not any(c.wg_split == "k" for c in hopper_tiling.candidate_configs(
      64, 4096, 7168, groups=32, grouped=True))
  # Decode K loops of >= 12 blocks (and split-K ones) take two blocks per step, in a
  # ring of the same bytes; shorter ones and large M one.
  for m, n, k in ((64, 7168, 2048), (128, 24576, 1536), (128, 7168, 16384), (64, 2112, 7168),
                  (128, 4096, 7168)):
    cfg = hopper_tiling.default_config(m, n, k)
    assert cfg.k_step == 2, (m, n, k, cfg)
  for m, n, k in ((128, 32768, 512), (64, 2112, 1024), (4096, 7168, 16384), (4096, 2112, 7168)):
    assert hopper_tiling.default_config(m, n, k).k_step == 1, (m, n, k)
  assert hopper_tiling.default_config(64, 7168, 2048).stages == 4  # 8 one-block stages of 64 x 64
  # 128x24576x1536 still chains (6 steps of 2 blocks on a 3-deep ring).
  assert hopper_tiling.chains_tiles(mid, 128, 24576, 1536)
  assert any(c.k_step == 2 for c in hopper_tiling.candidate_configs(128, 7168, 2048))
  # Autotuning also times pairs of 64-row tiles sharing B (no K split) where M has
  # two row tiles; no candidate pairs a tile with one wholly past M.
  assert any(c.cluster_m == 2 and c.tile_m == 64 and c.split_k == 1
             for c in hopper_tiling.candidate_configs(128, 4096, 7168))
  for m, n, k in ((64, 4096, 7168), (128, 7168, 2048), (200, 7000, 1000), (4096, 7168, 2048)):
    for c in hopper_tiling.candidate_configs(m, n, k):
      assert c.cluster_m == 1 or pl.cdiv(m, c.tile_m) >= 2, (m, n, k, c)
  # Decode (and split-K decode) multiplies the scales at promotion; the chained
  # short-K tiles of large M carry their product.
  for m, n, k in ((64, 7168, 16384), (128, 7168, 2048), (1, 2112, 7168), (128, 4096, 7168)):
    assert not hopper_tiling.default_config(m, n, k).scale_product, (m, n, k)
    assert not any(c.scale_product for c in hopper_tiling.candidate_configs(m, n, k)), (m, n, k)
  assert hopper_tiling.default_config(4096, 32768, 512).scale_product
  # One wave of 128-row tiles over a long K: pairs of CTAs share A.
  assert hopper_tiling.default_config(128, 7168, 16384).cluster_n == 2
  for m, n, k in ((128, 24576, 1536), (128, 7168, 2048), (128, 4096, 7168), (64, 7168, 16384)):
    assert hopper_tiling.default_config(m, n, k).cluster_n == 1, (m, n, k)
  # Not where the tiles already fill the SMs, K is short, or M is large.
  for m, n, k in ((128, 7168, 16384), (64, 2112, 2048), (64, 24576, 1536), (256, 2112, 7168)):
    assert hopper_tiling.default_config(m, n, k).split_k == 1, (m, n, k)
  for m, n, k in ((64, 2112, 7168), (128, 4096, 7168), (4096, 7168, 16384), (4096, 2112, 7168),
                  (4097, 7000, 1000), (4096, 32768, 512), (64, 32768, 512), (64, 24576, 1536),
                  (7, 18432, 512)):
    for out_dtype in (BF16, F32):
      for c_dtype in (None, jnp.float32):
        cfg = hopper_tiling.default_config(m, n, k, out_dtype=out_dtype, c_dtype=c_dtype)
        cfg.check()
        assert cfg.smem_bytes(out_dtype, c_dtype) <= hopper_tiling.SMEM_BYTES


def test_mid_m_narrow_tiles():
  """Between decode and large M (dense, 128 x 128 recipe, K >= 4096), where the large-M
  tiles would leave many SMs idle, narrow tiles that fill one wave, with the decode
  tiles' K loop where a warpgroup holds one chunk (MID_M_FORMS; measured 1.10-1.95x at
  192-1024 rows x 576-7168 columns; the 64 x 96 form 1.04-1.48x at 192-1024 rows x
  576-4096 columns)."""
  def tile(cfg):
    return cfg.tile_m, cfg.tile_n, cfg.wg_split, cfg.k_step, cfg.stages, cfg.scale_product
  k96 = (64, 96, "k", 2, 4, False)
  for m, n, k, want in (
      (192, 2112, 7168, (64, 64, "k", 2, 6, False)), (256, 2112, 7168, (64, 64, "k", 2, 6, False)),
      (512, 1024, 4096, (64, 64, "k", 2, 6, False)), (256, 2112, 16384, (64, 64, "k", 2, 6, False)),
      (256, 4096, 7168, (128, 64, "m", 2, 4, False)), (384, 2112, 7168, k96),
      (384, 2048, 4096, k96), (192, 4096, 7168, k96), (320, 2112, 16384, k96),
      (448, 1536, 7168, k96), (768, 1024, 7168, k96), (256, 3072, 7168, k96),
      (1024, 576, 7168, k96),
      (512, 2112, 7168, (128, 64, "m", 2, 4, False)),
      (384, 4096, 7168, (128, 128, "m", 2, 3, False)), (768, 2112, 7168, (128, 128, "m", 2, 3, False)),
      (256, 7168, 16384, (128, 128, "m", 2, 3, False)), (512, 4096, 7168, (128, 128, "m", 2, 3, False)),
      (1024, 2112, 7168, (256, 64, "m", 1, 4, True))):
    cfg = hopper_tiling.default_config(m, n, k)
    assert tile(cfg) == want, (m, n, k, cfg)
    assert hopper_cost.in_mid_m_form(cfg)
    assert hopper_cost.units(cfg, m, n) <= 132 and cfg.split_k == 1, (m, n, k, cfg)
    # With a float32 output and residual the ring is what fits beside them.
    f32 = hopper_tiling.default_config(m, n, k, out_dtype=F32, c_dtype=F32)
    assert tile(f32)[:4] == want[:4] and f32.smem_bytes(F32, F32) <= hopper_tiling.SMEM_BYTES
    # An FP8 output of the 128 x 128 form keeps its ring (3 two-block stages; it had 2).
    if want[:2] == (128, 128):
      fp8 = hopper_tiling.fp8_output_config(m, n, k)
      assert tile(fp8) == want and fp8.smem_bytes(FP8, None) <= hopper_tiling.SMEM_BYTES
      assert hopper_tiling.fp8_output_config(m, n, k, c_dtype=F32).stages == 2
  # Where M leaves the last row tile partial, only the forms splitting K, ranked at 1.3x
  # (their kernels as fast as at whole row tiles, the call pays XLA's pads), so that
  # the 64 x 96 tiles take the shapes the 64 x 128 tiles split by columns had
  # (1.03-1.36x faster) and leave 190x2112 and 700x576 to the 64 x 64 form (0.82 / 0.94x
  # of it).
  k64 = (64, 64, "k", 2, 6, False)
  for m, n, k, want in ((200, 2112, 7168, k64), (129, 576, 7168, k64), (700, 576, 7168, k64),
                        (190, 2112, 7168, k64), (300, 2112, 7168, k96), (330, 2112, 7168, k96),
                        (450, 1536, 7168, k96), (600, 1024, 7168, k96), (1000, 576, 7168, k96),
                        (129, 3072, 7168, k96), (260, 2112, 16384, k96), (750, 1024, 4096, k96)):
    cfg = hopper_tiling.default_config(m, n, k)
    assert tile(cfg) == want, (m, n, k, cfg)
    aligned = -(-m // 64) * 64  # the same tiles, the last one whole
    cost = hopper_cost.MID_M_PARTIAL_ROWS_COST
    assert hopper_cost.estimated_time_us(cfg, m, n, k) == pytest.approx(
        cost * hopper_cost.estimated_time_us(cfg, aligned, n, k), rel=0.01)
  # Not 128- or 256-row forms over a partial row tile (192 / 1000 rows), nor over several
  # waves, short K loops, past MID_M_MAX, or in grouped and per-row-b GEMMs.
  for m, n, k, kw in ((192, 7168, 7168, {}), (1000, 2112, 7168, {}), (300, 7168, 7168, {}),
                      (1024, 4096, 7168, {}), (256, 7168, 2048, {}), (512, 7168, 7168, {}),
                      (256, 2112, 2048, {}), (2048, 2112, 7168, {}), (4096, 2112, 7168, {}),
                      (256, 2112, 7168, dict(b_scale_rows=1)),
                      (256, 2112, 7168, dict(grouped=True, row_masks=True)),
                      (256, 2112, 7168, dict(groups=4, grouped=True))):
    cfg = hopper_tiling.default_config(m, n, k, **kw)
    assert not hopper_cost.in_mid_m_form(cfg), (m, n, k, kw, cfg)
  # Over two waves a form has no estimate (autotuning may still time it); the large-M
  # form of the same tile keeps its own.
  two_waves = dataclasses.replace(hopper_tiling.default_config(256, 2112, 7168), num_sms=100)
  assert "one wave" in hopper_cost.unmodelled(two_waves, 256, 2112, 7168)
  assert hopper_cost.estimated_time_us(two_waves, 256, 2112, 7168) == math.inf
  large = hopper_tiling.default_config(768, 4096, 7168)
  assert (large.tile_m, large.k_step, large.scale_product) == (128, 1, True)
  assert hopper_cost.unmodelled(dataclasses.replace(large, tile_n=128, wg_split="m"),
                                768, 4096, 7168) is None
  # In that one wave, 64 x 128 tiles split by columns count at their measured
  # efficiency there: 128 x 64 tiles of two-block steps take 256x4096x7168's 128 tiles.
  narrow = hopper_tiling.candidate_configs(256, 4096, 7168)
  best = lambda key: min(hopper_cost.estimated_time_us(c, 256, 4096, 7168)
                        for c in narrow if hopper_cost.tile_key(c) == key)
  assert best((128, 64, "m", 2)) < best((64, 128, "n", 2)) < math.inf


def test_scaled_ring_tiles():
  """From SCALED_RING_MIN_M (512) to TMA_SCALES_MIN_M rows (dense, 128 x 128 recipe,
  K >= 24 blocks), 256 x 128 tiles alone with the scales in the ring and the step top
  overlapped (SCALED_RING_TILES; measured 1.015-1.15x over the picks before at 16
  shapes), where their waves hold no more tile area than the other tiles'."""
  def scaled(cfg, m, k):
    return hopper_cost.scaled_ring_tile(cfg, m, k, hopper_cost.LARGE_M_TILES)
  for m, n, k in ((1024, 4096, 7168), (1024, 7168, 16384), (1280, 18432, 7168),
                  (1536, 7168, 16384), (1792, 2112, 7168), (2000, 8192, 8192),
                  (512, 7168, 16384), (896, 4096, 7168), (768, 36864, 7168)):
    cfg = hopper_tiling.default_config(m, n, k)
    assert (cfg.tile_m, cfg.tile_n, cfg.wg_split, cfg.cluster_n) == (256, 128, "m", 1), cfg
    assert cfg.tma_scales and cfg.step_top_overlap and cfg.stages == 3 and scaled(cfg, m, k)
    assert cfg.producer_registers == 72
    # An FP8 output's epilogue takes them too (whole 128-column groups).
    assert scaled(hopper_tiling.fp8_output_config(m, n, k), m, k)
  # Not over short K loops, where they add tile area per wave, below 512 rows, from
  # TMA_SCALES_MIN_M (pairs), in a ring of 2 (a float32 residual beside a bf16
  # output), nor in grouped or per-row-b GEMMs.
  for m, n, k, kw in ((1024, 7168, 2048, {}), (1024, 32768, 512, {}), (1536, 4096, 7168, {}),
                      (1024, 18432, 7168, {}), (768, 7168, 16384, {}), (640, 7168, 18432, {}),
                      (512, 36864, 7168, {}), (384, 7168, 16384, {}), (2048, 4096, 7168, {}),
                      (1792, 2112, 7168, dict(c_dtype=F32)),
                      (1024, 4096, 7168, dict(b_scale_rows=1)),
                      (1024, 4096, 7168, dict(grouped=True, row_masks=True)),
                      (1024, 4096, 7168, dict(groups=2, grouped=True))):
    cfg = hopper_tiling.default_config(m, n, k, **kw)
    assert not (hopper_cost.tile_key(cfg) == (256, 128, "m", 2) and cfg.cluster_n == 1
                and cfg.tma_scales), (m, n, k, kw, cfg)
  # Without the scales in the ring (or in one of 2 stages) the tile has no estimate.
  cfg = hopper_tiling.default_config(1024, 4096, 7168)
  for other in (dict(tma_scales=False, step_top_overlap=False, probe_in_flight=False),
                dict(stages=2)):
    assert hopper_cost.unmodelled(dataclasses.replace(cfg, **other), 1024, 4096, 7168)
  assert "measurement" in hopper_cost.unmodelled(cfg, 1024, 4096, 2048)


def test_160_column_tiles_balance_waves():
  """Dense 128 x 160 tiles (one wide 64 x 160 chunk a warpgroup, no a-scale window)
  where their column count fills the waves that 128 x 192 tiles leave part idle:
  measured 1.06-1.16x over the 128 x 192 picks they replaced at 13 shapes of
  200-8192 rows (H200, 2026-11-28; RESULTS.md)."""
  for m, n, k in ((1280, 4096, 7168), (1152, 4096, 7168), (640, 4096, 7168),
                  (640, 7168, 16384), (2048, 2112, 7168), (1536, 1536, 7168),
                  (3072, 1536, 7168), (4096, 576, 7168), (200, 18432, 7168),
                  (768, 6144, 7168), (384, 12288, 7168), (1024, 2112, 2048),
                  (8192, 576, 7168)):
    cfg = hopper_tiling.default_config(m, n, k)
    assert (hopper_cost.tile_key(cfg), cfg.wide_chunks, cfg.a_scale_window) == (
        (128, 160, "m", 2), True, 0), (m, n, k, cfg)
    assert cfg.epi_tile_n == 32 and cfg.stages == 4
    wider = dataclasses.replace(cfg, tile_n=192, epi_tile_n=64)
    assert (hopper_cost.estimated_time_us(cfg, m, n, k)
            < hopper_cost.estimated_time_us(wider, m, n, k))
  # 128 x 192 tiles keep their a-scale windows where the ring brings no scales.
  cfg = hopper_tiling.default_config(768, 4096, 7168)
  assert (hopper_cost.tile_key(cfg), cfg.tma_scales, cfg.a_scale_window) == (
      (128, 192, "m", 2), False, 4)
  # An FP8 output's epilogue takes whole 128-column groups: never these tiles.
  assert hopper_tiling.fp8_output_config(1280, 4096, 7168).tile_n % 128 == 0


def test_wide_tiles_take_ring_scales_from_1024_rows():
  """Dense 128 x 192 and 128 x 160 tiles (one wide chunk a warpgroup) from 1024 rows
  to TMA_SCALES_MIN_M over >= 24 K blocks: the ring brings their scales (step top
  overlapped, descriptors carried, 4 stages) instead of an a-scale window or GMEM
  (H200 2026-11-29: 1.008-1.044x at K = 7168, 1.067-1.079x at K = 57344)."""
  for m, n, k, tile in ((1280, 4096, 7168, (128, 160, "m", 2)),
                        (1536, 4096, 7168, (128, 192, "m", 2)),
                        (1280, 2112, 7168, (128, 192, "m", 2)),
                        (1536, 1760, 57344, (128, 160, "m", 2)),
                        (1536, 2112, 57344, (128, 192, "m", 2))):
    cfg = hopper_tiling.default_config(m, n, k)
    assert hopper_cost.tile_key(cfg) == tile, (m, n, k, cfg)
    assert (cfg.tma_scales, cfg.step_top_overlap, cfg.desc_carry, cfg.a_scale_window,
            cfg.stages) == (True, True, True, 0, 4), (m, n, k, cfg)
    assert hopper_cost.wide_tile_ring_scales(tile, m, k, b_scale_rows=128)
  # Not below 1024 rows or over short K loops (a-scale windows kept), nor in grouped
  # GEMMs or with per-row b scales.
  for m, n, k, kw in ((768, 4096, 7168, {}), (1536, 2112, 2048, {}),
                      (1536, 4096, 7168, dict(grouped=True, row_masks=True)),
                      (1536, 4096, 7168, dict(groups=2, grouped=True))):
    cfg = hopper_tiling.default_config(m, n, k, **kw)
    assert not (hopper_cost.tile_key(cfg) in hopper_cost.WIDE_RING_SCALES_TILES
                and cfg.tma_scales), (m, n, k, kw, cfg)
  assert not hopper_cost.wide_tile_ring_scales((128, 192, "m", 2), 1536, 7168, b_scale_rows=1)
  assert not hopper_cost.wide_tile_ring_scales((128, 256, "n", 2), 1536, 7168, b_scale_rows=128)


def test_tile_order_rows_first_below_4096_rows():
  """A dense GEMM of fewer than 4096 rows walks its tiles rows first (both
  operands sit in the L2; H200 2026-11-28: 0.996-1.063x the walk along N at 20
  shapes of 1024-3000 rows) but in 128 x 128 tiles (0.965-1.013x) and pairs
  sharing A (0.987-1.006x); those, every tile from 4096 rows, and grouped GEMMs
  and fused GLUs from 1024 rows walk along N in bands of 8."""
  rows_first = ((2048, 2112, 7168), (1024, 18432, 7168), (1536, 2112, 7168),
                (1024, 4096, 7168), (3072, 7168, 2048), (1280, 4096, 7168),
                (2000, 2112, 7168), (1500, 18432, 7168))
  for m, n, k in rows_first:
    assert hopper_tiling.default_config(m, n, k).grid_minor == "m", (m, n, k)
  for m, n, k in ((4096, 2112, 7168), (8192, 576, 7168), (4096, 7168, 2048)):
    assert hopper_tiling.default_config(m, n, k).grid_minor == "n", (m, n, k)
  for m, n, k in ((2000, 7168, 2048), (1800, 7168, 16384)):
    cfg = hopper_tiling.default_config(m, n, k)
    assert (cfg.tile_m, cfg.tile_n, cfg.grid_minor) == (128, 128, "n"), (m, n, k, cfg)
  pair = hopper_tiling.default_config(2048, 4096, 7168)
  assert (pair.cluster_n, pair.grid_minor) == (2, "n")
  assert hopper_tiling.default_config(1408, 4096, 7168, groups=1, grouped=True,
                                      expected_m=1024).grid_minor == "n"
  assert hopper_tiling.default_config(2048, 4096, 7168, grouped=True,
                                      row_masks=True).grid_minor == "n"
  assert hopper_tiling.glu_config(2048, 4096, 7168, out_dtype=jnp.bfloat16).grid_minor == "n"
  assert hopper_tiling.default_config(512, 4096, 7168).grid_minor == "m"


def test_descriptors_carried_where_measured():
  """Dense K loops of one-block steps carry their WGMMA descriptors
  (HopperConfig.desc_carry) in the tilings where that was measured faster (H200
  2026-11-28: 128 x 192 +2.2%, 128 x 160 +1.2-1.7%, 256 x 128 pairs +1.1%), not in
  128 x 256 tiles split by columns (-1.5%), decode tiles of two-block steps, per-row
  b scales or ragged groups of two chunks a warpgroup; masked groups in the four
  tilings measured (+0.2-2.0%); ragged loops carrying their slot
  (test_ragged_slot_carried_with_one_chunk_a_warpgroup); 192 x 128 tiles of three
  consumers in their deeper ring (test_three_consumer_tiles_over_long_k_loops)."""
  for m, n, k in ((4096, 2112, 7168), (1280, 4096, 7168), (2048, 2112, 7168),
                  (4096, 4096, 7168), (1024, 4096, 7168)):
    assert hopper_tiling.default_config(m, n, k).desc_carry, (m, n, k)
  for m, n, k in ((4096, 7168, 2048), (128, 4096, 7168), (64, 2112, 7168)):
    assert not hopper_tiling.default_config(m, n, k).desc_carry, (m, n, k)
  assert not hopper_tiling.default_config(7168, 18432, 4096, out_dtype=jnp.float32,
                                          b_scale_rows=1).desc_carry
  assert not hopper_tiling.default_config(32768, 7168, 2048, groups=8, grouped=True,
                                          row_masks=True).desc_carry
  # masked groups: every measured tiling (192 x 128, 128 x 160, 128 x 192, decode 128 x 256)
  for g, cap, n, k, expected in ((1, 1408, 4096, 7168, 1024), (2, 768, 4096, 7168, 512),
                                 (4, 384, 7168, 2048, 256), (32, 128, 4096, 7168, 64)):
    assert hopper_tiling.default_config(cap, n, k, groups=g, grouped=True,
                                        expected_m=expected).desc_carry, (g, cap, n, k)
  for fields in (dict(k_step=2), dict(wg_split="k", stages=4), dict(a_scale_window=4)):
    with pytest.raises(ValueError, match="desc_carry"):
      dataclasses.replace(hopper.HopperConfig(desc_carry=True), **fields).check()


def test_one_producer_warp_where_measured():
  """One warp fills the ring (HopperConfig.producer_warp) in the tilings where that was
  measured faster (H200 2026-11-29): one chunk a warpgroup (dense 128 x 160, 128 x 192
  and 192 x 128 +1.1-2.1%, 192 x 128 over 4 K blocks +1.7%, masked +1.1-2.1%, ragged
  +1.8-1.9%, the weight gradient's 128 x 160 +0.5%); dense 128 x 256 and 128 x 128 tiles
  (+0.6-1.5% at 2048-8192 rows; not with a float32 output, 1.6% slower at 128 x 256, nor
  below 2048 rows: 1.1% slower at 2000x7168x2048, a spill at 512x7168x2048) and 256 x
  128 pairs sharing A over N >= 7168 (+0.8-1.7%; at N = 4096 1.6-4.7% slower); not 256 x
  128 tiles alone (-1.0%), decode tiles (not measured)."""
  for m, n, k in ((4096, 2112, 7168), (1536, 1760, 57344), (2048, 2112, 7168),
                  (4096, 32768, 512), (4096, 7168, 2048), (4096, 24576, 1536),
                  (2048, 7168, 16384), (4096, 7168, 16384), (4096, 18432, 7168)):
    assert hopper_tiling.default_config(m, n, k).producer_warp, (m, n, k)
  for m, n, k in ((4096, 4096, 7168), (8192, 4096, 7168), (128, 4096, 7168),
                  (64, 2112, 7168), (1024, 4096, 7168), (2000, 7168, 2048)):
    assert not hopper_tiling.default_config(m, n, k).producer_warp, (m, n, k)
  pairs = hopper_tiling.default_config(4096, 7168, 16384)
  assert (pairs.cluster_n, pairs.tile_m, pairs.tile_n) == (2, 256, 128)
  assert hopper_cost.producer_warp_pays(pairs, 4096, 7168, 16384, dense=True)
  assert not hopper_cost.producer_warp_pays(pairs, 4096, 4096, 16384, dense=True)
  assert not hopper_cost.producer_warp_pays(pairs, 4096, 7168, 16384, dense=False)
  assert not hopper_cost.producer_warp_pays(dataclasses.replace(pairs, cluster_n=1),
                                            4096, 7168, 16384, dense=True)
  short_two_consumers = dataclasses.replace(
      hopper_tiling.default_config(1536, 1760, 57344), producer_warp=False)
  assert hopper_cost.producer_warp_pays(short_two_consumers, 1536, 1760, 2048, dense=True)
  assert not hopper_cost.producer_warp_pays(short_two_consumers, 1536, 1760, 1920, dense=True)
  two_chunks = hopper_tiling.default_config(4096, 7168, 2048)
  assert (two_chunks.tile_m, two_chunks.tile_n, two_chunks.wg_split) == (128, 256, "n")
  assert not hopper_tiling.default_config(4096, 7168, 2048, out_dtype=jnp.float32).producer_warp
  assert hopper_tiling.default_config(4096, 7168, 16384, out_dtype=jnp.float32).producer_warp
  assert not hopper_tiling.default_config(512, 7168, 2048).producer_warp  # (spills)
  assert hopper_tiling.default_config(7168, 18432, 4096, out_dtype=jnp.float32,
                                      b_scale_rows=1).producer_warp
  assert hopper_tiling.default_config(32768, 4096, 7168, groups=8, grouped=True,
                                      row_masks=True).producer_warp
  assert not hopper_tiling.default_config(32768, 7168, 2048, groups=8, grouped=True,
                                          row_masks=True).producer_warp
  for g, cap, n, k in ((1, 1024, 4096, 7168), (2, 512, 4096, 7168), (4, 256, 7168, 2048)):
    assert hopper_tiling.default_config(cap, n, k, groups=g, grouped=True).producer_warp
  assert not hopper_tiling.default_config(64, 4096, 7168, groups=32, grouped=True).producer_warp


def test_cost_model_chain_rule():
  # The tiling rules' cost model charges less per tile where every CTA runs
  # >= 2 tiles and the ring wraps at a tile's end (the kernel's ring always runs on).
  assert hopper_tiling.chains_tiles(CHAIN, 200, 150, 512)        # 12 tiles on 2 CTAs, 4 K blocks
  assert hopper_tiling.chains_tiles(CHAIN, 130, 300, 500)        # 15 tiles: 8 and 7 per CTA
  assert hopper_tiling.chains_tiles(CHAIN_3, 130, 200, 384)      # 4 tiles, 3 K blocks, 3 stages
  assert not hopper_tiling.chains_tiles(CHAIN, 64, 64, 512)      # one tile: one CTA, no chain
  assert not hopper_tiling.chains_tiles(CHAIN, 100, 64, 512)     # 2 tiles on 2 CTAs: one each
  assert not hopper_tiling.chains_tiles(CHAIN, 200, 150, 384)    # 3 K blocks, 2 stages
  # Large-M default tilings chain where their ring divides the K blocks.
  wide = hopper_tiling.default_config(4096, 24576, 1536)
  assert hopper_tiling.chains_tiles(wide, 4096, 24576, 1536)
  assert hopper_tiling.chains_tiles(THREE_WG, 400, 260, 512)      # 3 x 3 tiles of 192 x 128, 2 CTAs


def test_three_consumer_tiles_over_long_k_loops():
  """Dense GEMMs over long K loops may take 192 x 128 tiles of three consumer
  warpgroups in a ring one stage deeper, carrying their WGMMA descriptors (H200
  2026-11-28: 1.009-1.026x the 128 x 192 tiles at 4096 / 8192 x 2112 x 7168, bf16
  and float32 out); not where a residual's ring leaves them 3 stages (0.95-0.97x),
  not in their chained short-K form (no descriptors carried: measured 1.000). Masked
  GEMMs take the deeper ring over long K loops with the scales in it (1 x 1024:
  1.025-1.03x; with the scales from GMEM 0.95x), not over short ones."""
  three = lambda cfg: (cfg.tile_m, cfg.tile_n, cfg.consumers) == (192, 128, 3)
  for m, out in itertools.product((4096, 8192), (BF16, F32)):
    cfg = hopper_tiling.default_config(m, 2112, 7168, out_dtype=out)
    assert three(cfg) and cfg.stages == 4 and cfg.desc_carry, (m, out, cfg)
    assert hopper_cost.deeper_ring(cfg)
  with_c = hopper_tiling.default_config(4096, 2112, 7168, c_dtype=F32)
  assert not three(with_c), with_c
  short = hopper_tiling.default_config(4096, 32768, 512)
  assert three(short) and not short.desc_carry, short
  masked = hopper_tiling.default_config(1408, 4096, 7168, groups=1, grouped=True,
                                        expected_m=1024)
  assert three(masked) and masked.stages == 4 and masked.tma_scales, masked
  assert masked.step_top_overlap and masked.desc_carry and hopper_cost.deeper_ring(masked)
  # Over 16 K blocks a masked 192 x 128 tile takes the deeper ring too, its scales
  # from GMEM (test_masked_192x128_tiles_take_four_stages_over_short_k_loops).
  short = hopper_tiling.default_config(1408, 4096, 2048, groups=1, grouped=True)
  assert three(short) and short.stages == 4 and not short.tma_scales, short
  for k in (2048, 7168):  # the efficiency of the deeper ring over long K loops only
    assert hopper_cost.takes_deeper_ring((192, 128, "m", 3), 4096, k, row_masks=False,
                                         b_scale_rows=128, masked=False) == (k == 7168)
  # ... and the scales in the ring (as measured): not below TMA_SCALES_MIN_M rows
  assert not hopper_cost.takes_deeper_ring((192, 128, "m", 3), 1024, 7168, row_masks=False,
                                           b_scale_rows=128, masked=False)
  assert not three(hopper_tiling.default_config(768, 4096, 7168))


def test_masked_128x160_tiles_take_five_stages_over_long_k_loops():
  """Masked 128 x 160 tiles (live-first, scales from GMEM) take a ring of 5 over
  long K loops (H200 2026-11-28: 1.009-1.013x the 4 stages at 2 x ~512 4096x7168),
  RING_BYTES' 4 over short ones; dense ones keep RING_BYTES' ring."""
  long_k = hopper_tiling.default_config(768, 4096, 7168, groups=2, grouped=True,
                                        expected_m=512)
  assert (long_k.tile_m, long_k.tile_n, long_k.live_first) == (128, 160, True), long_k
  assert long_k.stages == 5 and not long_k.tma_scales and hopper_cost.deeper_ring(long_k)
  for t in (128, 160, "m", 2), (192, 128, "m", 3):
    assert hopper_cost.takes_deeper_ring(t, 768, 7168, row_masks=False, b_scale_rows=128,
                                         masked=True)
  assert not hopper_cost.takes_deeper_ring((128, 160, "m", 2), 768, 2048, row_masks=False,
                                           b_scale_rows=128, masked=True)
  assert not hopper_cost.takes_deeper_ring((128, 160, "m", 2), 4096, 7168, row_masks=False,
                                           b_scale_rows=128, masked=False)
  short_k = hopper_tiling.default_config(512, 7168, 2048, groups=2, grouped=True)
  assert (short_k.tile_m, short_k.tile_n, short_k.stages) == (128, 160, 4), short_k


def test_masked_192x128_tiles_take_four_stages_over_short_k_loops():
  """Masked 192 x 128 tiles of three consumers take a ring of 4 over K loops of
  16-31 blocks too, their scales from GMEM (H200 2026-11-29: 1.058x the ring of 3
  at 2 x ~512 7168x2048, 1.018x at 1 x ~1024; the ring's scales 1.023x / 0.991x);
  shorter loops, dense and ragged GEMMs keep RING_BYTES' ring."""
  t = (192, 128, "m", 3)
  for rows, groups, expected in ((768, 2, 512), (1408, 1, 1024)):
    cfg = hopper_tiling.default_config(rows, 7168, 2048, groups=groups, grouped=True,
                                       expected_m=expected)
    assert hopper_cost.tile_key(cfg) == t and cfg.stages == 4, cfg
    assert not cfg.tma_scales and hopper_cost.deeper_ring(cfg), cfg
  def deeper(k, **kw):
    args = dict(row_masks=False, b_scale_rows=128, masked=True)
    return hopper_cost.takes_deeper_ring(t, 768, k, **{**args, **kw})
  assert deeper(2048) and deeper(3968) and not deeper(1920)
  assert not deeper(2048, masked=False) and not deeper(2048, row_masks=True)
  assert not deeper(2048, b_scale_rows=1)
  # The ring brings the scales over long K loops only.
  assert not hopper_cost.deeper_ring_scales_in_ring(t, 2048, masked=True)
  assert hopper_cost.deeper_ring_scales_in_ring(t, 4096, masked=True)
  assert not hopper_cost.deeper_ring_scales_in_ring(t, 4096, masked=False)


def test_ragged_two_chunk_tiles():
  """A ragged unit runs at most one K pass behind a branch (a loop of 0 or 1
  passes made ptxas spill 128 x 256 tiles): 128 x 256 split by columns is a
  candidate over short K loops, where it measured fastest; warpgroups of two
  chunk rows never (256 x 128 tiles carrying their descriptors ran 0.975-1.00x the
  128 x 192 tiles carrying slot and descriptors at 2-8 groups of 32768 rows)."""
  assert scheduler.RaggedScheduler.single_pass
  for m, n, k, g in itertools.product((256, 4096, 8192, 32768), (576, 2112, 4096, 7168),
                                      (512, 2048, 7168), (1, 8)):
    for cfg in hopper_tiling.candidate_configs(m, n, k, groups=g, grouped=True,
                                               row_masks=True):
      wm, wn = cfg.wg_tile()
      chunks = (wm // 64) * (wn // cfg.chunk()[1])
      two_chunks = (cfg.tile_m, cfg.tile_n, cfg.wg_split) == (128, 256, "n")
      assert chunks == 1 or (
          two_chunks and k <= 128 * hopper_cost.RAGGED_SHORT_K_BLOCKS), (m, n, k, cfg)


def test_ragged_long_groups_take_three_consumers():
  """Ragged groups of >= 8192 rows on average over long K loops take 192 x 128
  tiles of three consumers (H200 2026-11-28: 1.021-1.026x the 128 x 192 tiles at 1 x
  32768, 2 x ~16384, 4 x ~8192 of 4096 x 7168; 0.995x at 8 x ~4096; at K = 2048
  0.99-1.007x the 128 x 256 tiles): the rows per group, not M, decide."""
  def tile(m, n, k, g):
    cfg = hopper_tiling.default_config(m, n, k, groups=g, grouped=True, row_masks=True)
    return cfg.tile_m, cfg.tile_n, cfg.consumers, cfg.stages, cfg.carried_slot, cfg.desc_carry
  three = (192, 128, 3, 3, True, True)
  for g in (1, 2, 4):
    assert tile(32768, 4096, 7168, g) == three, g
  assert tile(65536, 4096, 7168, 8) == three
  assert tile(32768, 4096, 7168, 8)[:3] == (128, 192, 2)
  assert tile(32768, 4096, 4096, 4) == three
  assert tile(32768, 4096, 3968, 4)[:3] == (128, 192, 2)   # 31 K blocks: not measured
  assert tile(32768, 7168, 2048, 4)[:3] == (128, 256, 2)   # short K: its own table
  assert (hopper_cost.large_m_tiles(7168, row_masks=True, group_rows=8192)
          is hopper_cost.RAGGED_LONG_GROUP_TILES)
  assert (hopper_cost.large_m_tiles(7168, row_masks=True, group_rows=8191)
          is hopper_cost.RAGGED_TILES)
  assert hopper_cost.large_m_tiles(7168, row_masks=True) is hopper_cost.RAGGED_TILES


def test_ragged_slot_carried_with_one_chunk_a_warpgroup():
  """Ragged K loops carry their ring slot where each consumer warpgroup holds one
  WGMMA chunk (H200 2026-11-28: 128 x 192 +0.8-1.4%, 128 x 128 +2.4-2.8%), and
  their WGMMA descriptors with it (+0.7-1.0% more), not with two (256 x 128,
  128 x 256: 3.4-4.2x slower); dense loops carry it whatever the field says, masked
  ones never take it. Groups of ~4096 rows at 4096 x 7168 take these 128 x 192 tiles
  too (1.00-1.025x the 256 x 128 tiles a rule took there before); at K = 2048 the
  128 x 256 tiles split by columns stay (128 x 192 carrying both ran 0.98x)."""
  for g, rows, n, k in ((16, 2048, 4096, 7168), (64, 512, 4096, 7168), (8, 256, 4096, 7168),
                        (8, 256, 7168, 2048), (1, 8192, 2112, 7168), (2, 16384, 4096, 7168),
                        (4, 8192, 4096, 7168), (8, 4096, 4096, 7168)):
    cfg = hopper_tiling.default_config(g * rows, n, k, groups=g, grouped=True, row_masks=True)
    assert cfg.chunks_per_warpgroup() == 1 and cfg.carried_slot and cfg.desc_carry, (
        g, rows, n, k, cfg)
  for g in (8, 16):
    cfg = hopper_tiling.default_config(32768, 4096, 7168, groups=g, grouped=True, row_masks=True)
    assert (cfg.tile_m, cfg.tile_n, cfg.wg_split) == (128, 192, "m"), (g, cfg)
  for g, rows, n, k in ((4, 8192, 7168, 2048), (16, 2048, 7168, 2048)):
    cfg = hopper_tiling.default_config(g * rows, n, k, groups=g, grouped=True, row_masks=True)
    assert cfg.chunks_per_warpgroup() == 2 and not cfg.carried_slot, (g, rows, n, k, cfg)
  assert not hopper_tiling.default_config(4096, 2112, 7168).carried_slot
  for g, cap, n, k, expected in ((1, 1408, 4096, 7168, 1024), (4, 384, 7168, 2048, 256)):
    assert not hopper_tiling.default_config(cap, n, k, groups=g, grouped=True,
                                            expected_m=expected).carried_slot


def test_masked_tiles_at_large_m():
  """Masked groups at large M take tiles of one 64-row chunk row per warpgroup
  (a 128 x 256 tile ran 2.8-4x slower there), and their estimate follows the
  rows a fill of M gives: the mean lies between half-full and full groups."""
  for g, m, n, k in ((1, 1408, 4096, 7168), (2, 768, 4096, 7168), (4, 384, 7168, 2048),
                     (8, 256, 4096, 7168)):
    cands = hopper_tiling.candidate_configs(m, n, k, groups=g, grouped=True)
    assert cands and all(c.wg_tile()[0] == hopper.CHUNK_M and (c.wide_chunks or
                                                               c.wg_tile()[1] <= 128)
                         for c in cands), (g, m, n, k)
    best = cands[0]
    est = lambda rows: hopper_cost.estimated_time_us(best, rows, n, k, g, masked=True)
    half, full = (hopper_cost._time_us(best, r, n, k, g, 132, hopper_cost.MASKED_TILES)
                  for r in (m // 2, m))
    assert half <= est(m) <= full and half < full
  # The dense rules keep tiles of two chunk rows per warpgroup at the same shape.
  dense = hopper_tiling.default_config(1024, 4096, 7168)
  assert dense.wg_tile()[0] == 2 * hopper.CHUNK_M, dense


def test_masked_walk_and_fills():
  """Masked candidates walk live-first exactly where the table says, wide ones stage
  no a-scale windows, 128 x 192 takes its deeper ring; the fills the estimate
  averages over: points in [0, 1), group 0's spread evenly, no two groups alike,
  as rows in [M / 2, M], or told expected_m, in [0.7, 1.3] x it and at most M."""
  for g, m, n, k in ((1, 1408, 4096, 7168), (4, 384, 7168, 2048), (4, 256, 4096, 7168)):
    for c in hopper_tiling.candidate_configs(m, n, k, groups=g, grouped=True):
      assert c.live_first == (hopper_cost.tile_key(c) in hopper_cost.MASKED_LIVE_FIRST_TILES)
      assert c.a_scale_window == 0, c
      if hopper_cost.tile_key(c) in hopper_cost.DEEPER_RING_TILES:
        assert c.stages == hopper_cost.ring_stages(c) + 1, c
  # Past MASKED_LIVE_FIRST_MAX_GROUPS groups no candidate takes the live-first walk.
  many = hopper_cost.MASKED_LIVE_FIRST_MAX_GROUPS + 1
  assert not any(c.live_first for c in hopper_tiling.candidate_configs(
      256, 7168, 2048, groups=many, grouped=True))
  # ... and tiles that may walk plainly stay candidates there (walking so).
  assert {hopper_cost.tile_key(c) for c in hopper_tiling.candidate_configs(
      1408, 4096, 7168, groups=many, grouped=True)} >= set(hopper_cost.MASKED_PLAIN_WALK_TILES)
  # Dense and ragged configs never take the masked walk.
  assert not hopper_tiling.default_config(4096, 4096, 7168).live_first
  assert not hopper_tiling.default_config(32768, 4096, 7168, groups=8, grouped=True,
                                          row_masks=True).live_first
  fills = hopper_cost.masked_fills(3)
  assert len(fills) == hopper_cost.MASKED_DRAWS and all(len(f) == 3 for f in fills)
  assert all(0.0 <= x < 1.0 for f in fills for x in f)
  first = sorted(f[0] for f in fills)
  assert np.allclose(np.diff(first), 1.0 / hopper_cost.MASKED_DRAWS)
  assert len({tuple(round(x, 6) for x in f) for f in fills}) == len(fills)
  assert all(len({round(x, 6) for x in f}) == 3 for f in fills)
  rows = np.asarray(hopper_cost.masked_rows(768, 3))
  assert rows.shape == (hopper_cost.MASKED_DRAWS, 3) and rows.min() >= 384 and rows.max() <= 768
  rows = np.asarray(hopper_cost.masked_rows(768, 3, expected_m=500))
  assert rows.min() >= 350 and rows.max() == 650
  assert np.asarray(hopper_cost.masked_rows(768, 3, expected_m=700)).max() == 768  # capped


# (groups, capacity, expected_m, N, K) -> (the pick without the hint, with it,
# whether that walks live-first): the tiles of the expected fills' capacity (decode
# fills: of 128 rows, up to 16 groups), live-first at fills of at most a quarter of M
# and 192 x 128 tiles at any fill (up to 16 groups).
MASKED_HINTED_PICKS = [
    ((2, 768, 512, 4096, 7168), ((192, 128), (128, 160), True)),
    ((8, 2048, 256, 4096, 7168), ((192, 128), (128, 160), True)),
    ((4, 2048, 256, 7168, 2048), ((192, 128), (128, 192), True)),
    ((1, 1408, 1024, 4096, 7168), ((192, 128), (192, 128), True)),
    ((2, 4096, 1024, 4096, 7168), ((192, 128), (192, 128), True)),    # fills past M / 4
    ((4, 4096, 100, 4096, 7168), ((192, 128), (192, 128), True)),     # 130 rows: large M
    ((8, 2048, 64, 4096, 7168), ((192, 128), (128, 256), True)),      # decode fills
    ((16, 2048, 32, 7168, 2048), ((192, 128), (128, 256), True)),
    ((32, 4096, 32, 7168, 2048), ((192, 128), (192, 128), False)),    # 32 groups: no walk
    ((32, 128, 64, 4096, 7168), ((128, 256), (128, 256), False)),     # decode capacity
    ((8, 128, 20, 4096, 7168), ((128, 256), (128, 256), False)),      # ... one row tile
    ((8, 256, 64, 4096, 7168), ((192, 128), (192, 128), True)),       # decode fills, not sparse
]


@pytest.mark.parametrize("case,picks", MASKED_HINTED_PICKS)
def test_masked_expected_m_picks(case, picks):
  g, m, expected, n, k = case
  plain = hopper_tiling.default_config(m, n, k, groups=g, grouped=True)
  hinted = hopper_tiling.default_config(m, n, k, groups=g, grouped=True, expected_m=expected)
  assert ((plain.tile_m, plain.tile_n), (hinted.tile_m, hinted.tile_n),
          hinted.live_first) == picks
  assert hinted == hopper_tiling.candidate_configs(m, n, k, groups=g, grouped=True,
                                                   expected_m=expected)[0]
  rows = int(np.ceil(1.3 * expected))
  sparse = g <= 16 and rows <= m / 4 and m > 128
  assert hopper_cost.sparse_fill(m, expected, g) == sparse
  decode_rows = hopper_cost.DECODE_MAX_M if sparse else m
  assert hopper_cost.masked_capacity(m, expected, g) == (
      decode_rows if rows <= hopper_cost.DECODE_MAX_M else min(m, rows))
  # Dense and ragged GEMMs take no hint.
  assert hopper_tiling.default_config(m, n, k, groups=g, grouped=True, row_masks=True,
                                      expected_m=expected) == hopper_tiling.default_config(
                                          m, n, k, groups=g, grouped=True, row_masks=True)


def test_probe_in_flight_for_two_consumers():
  """The next slot's barrier is tested while the step's last WGMMA runs
  (HopperConfig.probe_in_flight) in loops that test it ahead with two consumer
  warpgroups (H200 2026-11-29: +0.2-1.5% dense, +0.1% ragged 128 x 192), not with
  three (192 x 128: 3.5-4.2% slower), nor in loops that test no barrier ahead."""
  for m, n, k in ((4096, 18432, 7168), (4096, 7168, 16384), (1536, 1760, 57344),
                  (2048, 7168, 16384), (4096, 7168, 2048)):
    cfg = hopper_tiling.default_config(m, n, k)
    assert cfg.consumers == 2 and cfg.probe_in_flight, (m, n, k, cfg)
  three = hopper_tiling.default_config(4096, 2112, 7168)
  assert three.consumers == 3 and three.step_top_overlap and not three.probe_in_flight
  assert hopper_tiling.default_config(32768, 4096, 7168, groups=8, grouped=True,
                                      row_masks=True).probe_in_flight
  assert not hopper_tiling.default_config(32768, 4096, 7168, groups=4, grouped=True,
                                          row_masks=True).probe_in_flight
  for g, cap, n, k in ((2, 768, 4096, 7168), (4, 384, 7168, 2048), (32, 128, 4096, 7168)):
    cfg = hopper_tiling.default_config(cap, n, k, groups=g, grouped=True)
    assert not cfg.probe_in_flight, (g, cap, cfg)
  assert not hopper_tiling.default_config(7168, 18432, 4096, out_dtype=jnp.float32,
                                          b_scale_rows=1).probe_in_flight
  with pytest.raises(ValueError, match="probe_in_flight"):
    dataclasses.replace(three, step_top_overlap=False, probe_in_flight=True).check()
