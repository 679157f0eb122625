"""A consumer's FP8 WGMMA chunk issued from SMEM descriptors its K loop carries.

Pallas's `wgmma` forms both operand descriptors from the ring slot's SMEM address
at every issue: a chain of dependent uniform instructions (the slot's offset,
the address's 14-bit field, the descriptor's constant bits) that ptxas leaves
after the ring wait's branch, between the last promotion and the next WGMMA
(benchmarks/RESULTS.md, 2026-11-27 11:26). A K loop that carries each slot's
start-address field, formed during the step before, issues its WGMMAs with one
`or` per operand instead (HopperConfig.desc_carry):

  address_field(ref)                -> int32: ref's SMEM address / 16, ref a
                                       whole ring buffer (its first element)
  issue(a_field, b_field, rows, cols) -> [rows, cols] f32 block, in flight: one
                                       128-deep K block of A[rows, 128] .
                                       B[cols, 128]^T onto zeros
  done(block)                       -> the block once every WGMMA in flight has
                                       written it

Both operands are K-major 8 x 128-byte atoms with the 128-byte swizzle (the
rings' layout, `common.tiled`), so a slot's rows start at a multiple of 1024
bytes and the descriptor's other fields are constants: no leading byte offset
(K is contiguous), a stride of 1024 bytes between atoms, the 128-byte swizzle
mode. SMEM addresses are below 2^18 bytes, so the 14-bit field never carries
into the next.

These are Mosaic GPU code inlined into Pallas (`plgpu.inline_mgpu`, and Mosaic's
`wgmma_m64` for the instructions themselves); GPU interpret mode cannot run
them, so the K loop takes Pallas's `wgmma` there (hopper._Warpgroup.k_loop), and
`tests/test_pallas_sm90.py` compares the two paths bit for bit on the GPU.
"""
from __future__ import annotations

import importlib

import jax.numpy as jnp
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, llvm, nvvm
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

from jax_fp8.pallas.common import K_BLOCK

# The module, not the function of the same name that jax.experimental.mosaic.gpu exports.
_mosaic_wgmma = importlib.import_module("jax.experimental.mosaic.gpu.wgmma")

ATOM_ROWS = 8                  # rows of one swizzle atom (128 bytes each)
ROW_FIELD = K_BLOCK // 16      # one K-major FP8 row of a K block, in address-field units
_STRIDE_BYTES = ATOM_ROWS * K_BLOCK
_SWIZZLE_128B = 1
_DESC_CONST = ((_STRIDE_BYTES >> 4) << 32) | (_SWIZZLE_128B << 62)
assert _DESC_CONST < 1 << 63  # a signed 64-bit constant
_K_INSTR_BYTES = 32            # one WGMMA instruction's K (FP8: 32 elements)
_SCALAR = plgpu.Layout.WG_SPLAT(shape=())
_RING_TRANSFORMS = (plgpu.TilingTransform((ATOM_ROWS, K_BLOCK)), plgpu.SwizzleTransform(128))


def address_field(ring) -> jnp.ndarray:
  """ring's SMEM address / 16 (int32), ring a whole buffer tiled as `common.tiled`."""
  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(transforms=_RING_TRANSFORMS),),
                     return_type=plgpu.ShapeDtypeStruct((), jnp.int32, layout=_SCALAR))
  def body(ctx, ref):
    del ctx
    i64, i32 = ir.IntegerType.get_signless(64), ir.IntegerType.get_signless(32)
    address = llvm.ptrtoint(i64, mgpu_utils.memref_ptr(ref))
    field = arith.trunci(i32, arith.shrui(address, arith.constant(i64, 4)))
    return fa.FragmentedArray.splat(field, (), layout=mgpu.WGSplatFragLayout(()),
                                    is_signed=True)
  return body(ring)


def _descriptor(field):
  """The 64-bit descriptor of the operand whose address field is `field`."""
  i64 = ir.IntegerType.get_signless(64)
  (reg,) = field.registers.flat
  return llvm.or_(arith.extui(i64, reg), arith.constant(i64, _DESC_CONST))  # (bit 63 clear)


def issue(a_field, b_field, rows: int, cols: int):
  """Issues one K block's WGMMAs of a [rows, cols] chunk onto zeros; returns the
  block, in flight until `done`."""
  if rows != 64:
    raise ValueError(f"a chunk is 64 rows (one WGMMA), got {rows}")
  zeros = plgpu.layout_cast(jnp.zeros((rows, cols), jnp.float32), plgpu.Layout.WGMMA)

  @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, _SCALAR, _SCALAR),
                     return_type=plgpu.ShapeDtypeStruct((rows, cols), jnp.float32,
                                                        layout=plgpu.Layout.WGMMA))
  def body(ctx, acc, a, b):
    del ctx
    fp8 = ir.Float8E4M3FNType.get()
    accumulator = _mosaic_wgmma.WGMMAAccumulator.from_registers(acc)  # fenced
    registers = accumulator._value.registers.copy()
    registers[0:1] = _mosaic_wgmma.wgmma_m64(
        registers[0:1], _descriptor(a), _descriptor(b), a_transpose=False, b_transpose=False,
        a_k_stride=_K_INSTR_BYTES, b_k_stride=_K_INSTR_BYTES, n=cols, swizzle=128,
        a_element_type=fp8, b_element_type=fp8)
    nvvm.wgmma_commit_group_sync_aligned()
    block = fa.FragmentedArray(_registers=registers, _layout=accumulator._value.layout,
                               _is_signed=None)
    return _mosaic_wgmma.WGMMAAccumulator(
        _value=block, _original_layout=accumulator._original_layout, _sync=False).value
  return body(zeros, a_field, b_field)


def done(block):
  """block once every WGMMA in flight has written it (`wgmma.wait_group 0`); the
  optimization barrier keeps its reads after the wait."""
  @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA,),
                     return_type=plgpu.ShapeDtypeStruct(block.shape, jnp.float32,
                                                        layout=plgpu.Layout.WGMMA))
  def body(ctx, acc):
    del ctx
    nvvm.wgmma_wait_group_sync_aligned(0)
    return fa.optimization_barrier(acc)
  return body(block)
