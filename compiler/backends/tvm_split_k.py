"""Split-K convolutions for CUDA builds: a deep convolution's reduction split over thread blocks.

dlight's Matmul rule runs a convolution as an implicit GEMM: one thread block per 32x64 tile of
(output pixels x output channels), each looping over the whole reduction (kernel y, kernel x,
input channel). Deep in a CNN the output is small and the reduction long: ResNet-18's 7x7x512
convolutions give 16 tiles at batch 1, each 4608 deep, so 16 of an H200's 132 multiprocessors
work and the rest wait (357 us per convolution at batch 8, 5 TFLOPS). Here such a convolution
becomes S partial convolutions over S slices of the input channels, one more GEMM axis that
dlight's Matmul rule spreads over blocks, and a sum over S that the epilogue (bias, residual,
ReLU) fuses into. S doubles while the tiles at batch 1 do not fill the GPU and each slice keeps
at least MIN_DEPTH of the reduction. On an H200 those convolutions then took 123 to 143 us at
batch 8, and the whole network 2.20 ms against 3.28 unsplit (eager PyTorch: 2.21); at batch 1,
0.87 ms against 2.56 (eager: 2.10).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable

import tvm
from tvm import relax, te, topi

from compiler.backends.tvm_convert import dense_channels_last_f32

# The multiprocessors of an H100 or H200; on a smaller GPU this splits a little more than needed.
MULTIPROCESSORS = 132
# The least reduction per slice: below it the partial sums cost more traffic than the split saves.
MIN_DEPTH = 512
# TVM's OpPatternKind kOutEWiseFusable, which AnnotateTIROpPattern keeps where a function has it.
_OUT_ELEMWISE_FUSABLE = 4


def legalize_conv2d(tile_rows: int, tile_cols: int) -> Callable[[relax.BlockBuilder, relax.Call], relax.Expr]:
    """LegalizeOps' conv2d entry for GEMM tiles of tile_rows output pixels x tile_cols channels:
    split-K where it pays (see module doc), TOPI's convolution otherwise."""

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        splits = _splits(call, tile_rows, tile_cols)
        if splits == 1:
            return tvm.ir.Op.get("relax.nn.conv2d").get_attr("FLegalize")(bb, call)
        attrs = call.attrs
        partial = bb.emit_te(
            _partial_conv2d_nhwc,
            *call.args,
            splits=splits,
            out_hw=[int(call.ty.shape[1]), int(call.ty.shape[2])],
            strides=[int(s) for s in attrs.strides],
            padding=[int(p) for p in attrs.padding],
            dilation=[int(d) for d in attrs.dilation],
            primfunc_name_hint="conv2d_split_k",
        )
        total = bb.call_te(_sum_slices, partial, primfunc_name_hint="conv2d_split_k_sum")
        # Marked as a convolution's own output: FuseOps then fuses its epilogue (bias, residual,
        # ReLU) into this sum, and never inlines the sum into the next convolution's loads.
        function = total.args[0]
        bb.update_func(function, bb.get()[function].with_attr("op_pattern", _OUT_ELEMWISE_FUSABLE))
        return total

    return legalize


def _splits(call: relax.Call, tile_rows: int, tile_cols: int) -> int:
    """How many input-channel slices the convolution's reduction is split into (1: none)."""
    if not dense_channels_last_f32(call):
        return 1
    _, out_h, out_w, out_c = call.ty.shape
    _, kernel_h, kernel_w, channels = (int(d) for d in call.args[1].ty.shape)
    tiles = math.ceil(int(out_h) * int(out_w) / tile_rows) * math.ceil(int(out_c) / tile_cols)
    depth = kernel_h * kernel_w * channels
    splits = 1
    while tiles * splits < MULTIPROCESSORS and channels % (2 * splits) == 0:
        if depth // (2 * splits) < MIN_DEPTH:
            break
        splits *= 2
    return splits


def _sum_slices(partial: te.Tensor) -> te.Tensor:
    """partial[0] + ... + partial[S-1], elementwise: one coalesced pass, no reduction loop."""
    splits = int(partial.shape[0])
    return te.compute(
        partial.shape[1:],
        lambda *index: functools.reduce(operator.add, (partial[(s, *index)] for s in range(splits))),
        name="conv2d_split_k_sum",
    )


def _partial_conv2d_nhwc(
    data: te.Tensor,
    weight: te.Tensor,
    splits: int,
    out_hw: list[int],
    strides: list[int],
    padding: list[int],
    dilation: list[int],
) -> te.Tensor:
    """partial[s, n, y, x, o]: the convolution over input channels [s*C/S, (s+1)*C/S), with
    the output's height and width as Relax inferred them for the convolution."""
    n, _, _, channels = data.shape
    out_c, kernel_h, kernel_w, _ = (int(d) for d in weight.shape)
    (out_h, out_w), (pad_t, pad_l, pad_b, pad_r) = out_hw, padding
    (stride_h, stride_w), (dilation_h, dilation_w) = strides, dilation
    padded = topi.nn.pad(data, (0, pad_t, pad_l, 0), (0, pad_b, pad_r, 0), name="pad_temp")
    chunk = int(channels) // splits
    ry = te.reduce_axis((0, kernel_h), "ry")
    rx = te.reduce_axis((0, kernel_w), "rx")
    rc = te.reduce_axis((0, chunk), "rc")
    return te.compute(
        (splits, n, out_h, out_w, out_c),
        lambda s, b, y, x, o: te.sum(
            padded[b, y * stride_h + ry * dilation_h, x * stride_w + rx * dilation_w, s * chunk + rc]
            * weight[o, ry, rx, s * chunk + rc],
            axis=[ry, rx, rc],
        ),
        name="conv2d_split_k",
    )
