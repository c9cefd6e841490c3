"""Winograd convolutions for tuned CPU builds: F(4x4, 3x3) in place of direct 3x3 convolutions.

A CNN spends most of its FLOPs in 3x3 stride-1 convolutions. Winograd's minimal filtering computes
each 4x4 output tile from a 6x6 input tile with 36 multiplies per channel pair instead of 144,
through a batched GEMM over 36 transformed planes. MetaSchedule has CPU schedule rules for its
data transforms (`conv2d_nhwc_winograd_data_pack`, `..._inverse`) and tiles the GEMM like any
matmul. In ResNet-18 tuned with 642 trials (AVX-512, 2 threads) its ten stride-1 convolutions at
56x56 to 14x14 took 7.5 ms together, where direct kernels at the 215 GFLOPS the others reached
would take about 10.8. At 7x7 the tiles are mostly padding, so those stay direct.

The compute is TOPI's `_conv2d_winograd_nhwc_impl`, with the kernel transformed once, at compile
time, from the constant weights: TVM 0.27's own pre-transformed variant raises ("LEGACY-FLOW"),
and its `conv2d_winograd_weight_transform` fails on a dtype object.
"""

from __future__ import annotations

import functools

import numpy as np
import tvm
from tvm import relax, te, topi
from tvm.topi.nn.utils import get_pad_tuple
from tvm.topi.nn.winograd_util import (
    _cook_toom_convolution,
    _interpolation_points,
    winograd_transform_matrices,
)

from compiler.backends.tvm_convert import dense_channels_last_f32

# Output tile size m of F(m x m, 3 x 3). TOPI's choice; relative error ~3e-6 per layer here.
TILE = 4
# Below this output size most of each tile is padding and direct convolution is faster.
MIN_OUTPUT = 14
# With few input channels the transforms cost more than the GEMM saves.
MIN_CHANNELS = 16


def legalize_conv2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """LegalizeOps' conv2d entry: Winograd where it pays (see module doc), TOPI's otherwise."""
    weight = _constant(bb, call.args[1])
    if weight is None or not _suits(call):
        return tvm.ir.Op.get("relax.nn.conv2d").get_attr("FLegalize")(bb, call)
    kernel = _transform_kernel(weight.value.numpy(), TILE)
    padding = [int(p) for p in call.attrs.padding]
    compute = functools.partial(_winograd_nhwc, padding=padding, m=TILE)
    return bb.call_te(compute, call.args[0], relax.const(kernel), primfunc_name_hint="conv2d_winograd")


def _constant(bb: relax.BlockBuilder, expr: relax.Expr) -> tvm.ir.expr.Constant | None:
    if isinstance(expr, relax.Var):
        expr = bb.lookup_binding(expr)
    return expr if isinstance(expr, tvm.ir.expr.Constant) else None


def _suits(call: relax.Call) -> bool:
    attrs = call.attrs
    if not dense_channels_last_f32(call):
        return False
    if [int(s) for s in attrs.strides] != [1, 1] or [int(d) for d in attrs.dilation] != [1, 1]:
        return False
    out = call.ty.shape
    _, kh, kw, ci = (int(d) for d in call.args[1].ty.shape)
    return (kh, kw) == (3, 3) and ci >= MIN_CHANNELS and min(int(out[1]), int(out[2])) >= MIN_OUTPUT


def _transform_kernel(weight_ohwi: np.ndarray, tile: int) -> np.ndarray:
    """OHWI weights -> the (alpha, alpha, O, I) planes the GEMM reads: G w G^T per channel pair,
    with TOPI's own G."""
    _, _, g = _cook_toom_convolution(_interpolation_points(tile + 1), tile, 3)
    planes = np.einsum("ak,okli,bl->aboi", g, weight_ohwi.astype(np.float64), g)
    return planes.astype(weight_ohwi.dtype)


def _winograd_nhwc(data: te.Tensor, kernel_pack: te.Tensor, padding: list[int], m: int) -> te.Tensor:
    """TOPI's NHWC Winograd compute for a pre-transformed kernel, block names and schedule-rule
    attributes unchanged, so MetaSchedule's Winograd rules apply."""
    n, in_height, in_width, ci = (int(d) for d in data.shape)
    alpha, _, co, _ = (int(d) for d in kernel_pack.shape)
    r = alpha + 1 - m
    pad_t, pad_l, pad_b, pad_r = get_pad_tuple(padding, (r, r))
    a, b, _ = winograd_transform_matrices(m, r, str(data.dtype))
    height = in_height + pad_t + pad_b - r + 1
    width = in_width + pad_l + pad_r - r + 1
    nh, nw = (height + m - 1) // m, (width + m - 1) // m
    tiles = n * nh * nw
    # Each axis padded out to the reach of its own tiles. TOPI pads both by the width's tiles,
    # measured against the output's height: an input taller than wide was read past its end
    # (errors of 2.7 at 32x16), or did not build (40x14).
    extra_h = max(0, (nh - 1) * m + alpha - (in_height + pad_t + pad_b))
    extra_w = max(0, (nw - 1) * m + alpha - (in_width + pad_l + pad_r))
    data_pad = topi.nn.pad(
        data,
        (0, pad_t, pad_l, 0),
        (0, pad_b + extra_h, pad_r + extra_w, 0),
        name="data_pad",
        attrs={"schedule_rule": "None"},
    )
    input_tile = te.compute(
        (alpha, alpha, tiles, ci),
        lambda eps, nu, p, c: data_pad[p // (nh * nw), ((p // nw) % nh) * m + eps, (p % nw) * m + nu, c],
        name="input_tile",
        attrs={"schedule_rule": "None"},
    )
    r_a = te.reduce_axis((0, alpha), "r_a")
    r_b = te.reduce_axis((0, alpha), "r_b")
    data_pack = te.compute(
        (alpha, alpha, tiles, ci),
        lambda eps, nu, p, c: te.sum(input_tile[r_a, r_b, p, c] * b[r_a, eps] * b[r_b, nu], axis=[r_a, r_b]),
        name="data_pack",
        attrs={
            "auto_scheduler_simplify_const_tensor_indices": ["eps", "nu", "r_a", "r_b"],
            "schedule_rule": "conv2d_nhwc_winograd_data_pack",
        },
    )
    k = te.reduce_axis((0, ci), name="ci")
    bgemm = te.compute(
        (alpha, alpha, tiles, co),
        lambda eps, nu, p, o: te.sum(data_pack[eps, nu, p, k] * kernel_pack[eps, nu, o, k], axis=[k]),
        name="bgemm",
        attrs={"layout_free_placeholders": [kernel_pack], "meta_schedule.write_cache_level": [2]},
    )
    r_a = te.reduce_axis((0, alpha), "r_a")
    r_b = te.reduce_axis((0, alpha), "r_b")
    inverse = te.compute(
        (m, m, tiles, co),
        lambda vh, vw, p, o: te.sum(bgemm[r_a, r_b, p, o] * a[r_a, vh] * a[r_b, vw], axis=[r_a, r_b]),
        name="inverse",
        attrs={
            "auto_scheduler_simplify_const_tensor_indices": ["vh", "vw", "r_a", "r_b"],
            "schedule_rule": "conv2d_nhwc_winograd_inverse",
        },
    )
    return te.compute(
        (n, height, width, co),
        lambda i, h, w, o: inverse[h % m, w % m, i * nh * nw + (h // m) * nw + (w // m), o],
        name="conv2d_winograd",
    )
