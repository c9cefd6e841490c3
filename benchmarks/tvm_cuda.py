"""TVM's untuned CUDA build against eager PyTorch on the same GPU, by layout and Matmul tiling.

    PYTHONPATH=. python benchmarks/tvm_cuda.py [--models resnet18,encoder] [--target cuda-sm90]

A GPU host only. Each model is exported as Kiln exports it (symbolic batch) and built by
`tvm_cuda.build` once per variant: convolutions NCHW as imported, or channels-last (Kiln's
default), with deep convolutions split-K (Kiln's default) or not; dlight's Matmul rule with
TVM's CUDA tiling, or another. Every build is timed at batch 1 and 8 with its inputs already on
the GPU, against eager in fp32 (TF32 off, as Kiln verifies) timed the same way in the same run,
and its largest error against eager is printed. Last, a per-kernel profile (CUPTI, through
torch.profiler) of eager and of the fastest ResNet-18 build at batch 8.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from benchmarks.models import GPU_MODELS
from compiler.backends import tvm_cuda
from compiler.frontend import export_program, load_torchscript
from compiler.spec import InputSpec

BATCHES = (1, 8)
REPEATS = 50


def variants() -> dict[str, dict[str, Any]]:
    """Build options by name. Tiles are rows x columns of the GEMM per thread block."""
    from tvm.s_tir.dlight.gpu import Matmul

    def tiles(block_x: int, block_y: int, micro_x: int, micro_y: int) -> Any:
        return Matmul.Config(
            block_size_x=block_x,
            block_size_y=block_y,
            micro_size_x=micro_x,
            micro_size_y=micro_y,
            micro_size_k=16,
            vector_size=min(4, micro_y),
            unroll=256,
            use_shared=True,
            storage_align=True,
        )

    return {
        "nchw": {"channels_last": False, "split_k": False},
        "nhwc": {"split_k": False},
        "nhwc split-k (kiln)": {},
        "nhwc 16x16/64t": {"split_k": False, "matmul": tiles(8, 8, 2, 2)},
        "nhwc split-k 16x16/64t": {"matmul": tiles(8, 8, 2, 2)},
    }


def timed(run: Callable[[], None], sync: Callable[[], None]) -> float:
    """Median milliseconds of one run, after warm-up, each run ended by a device sync."""
    for _ in range(5):
        run()
    sync()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def kernel_profile(run: Callable[[], Any]) -> str:
    """The GPU kernels of 10 runs by total time, seen by CUPTI: TVM's kernels as well as torch's."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for _ in range(10):
            run()
        torch.cuda.synchronize()
    averages = profiler.key_averages()
    return str(averages.table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))


def main() -> None:
    import tvm
    from tvm import relax

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet18,cnn,encoder")
    parser.add_argument("--target", default="cuda-sm90")
    parser.add_argument("--variants", default=",".join(variants()), help="names from the table's rows")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    console = Console(width=140)
    device = tvm_cuda.device(args.target)
    target = tvm_cuda.tvm_target(args.target)
    chosen = {name: options for name, options in variants().items() if name in args.variants.split(",")}
    # model -> (ms, a run at the largest batch, build label): the fastest build, and eager's run.
    best: dict[str, tuple[float, Callable[[], Any], str]] = {}
    eager_runs: dict[str, Callable[[], Any]] = {}

    for name in args.models.split(","):
        model = GPU_MODELS[name]
        spec = InputSpec.from_dicts(model.inputs, max(BATCHES))
        eager = model.module().cuda()
        normal = np.random.default_rng(0).standard_normal
        inputs = {b: [normal((b, *t.shape[1:]), dtype=np.float32) for t in spec.inputs] for b in BATCHES}
        table = Table(title=f"{name}: ms per run, inputs on the GPU")
        table.add_column("build")
        table.add_column("compile s", justify="right")
        for b in BATCHES:
            table.add_column(f"b{b} ms", justify="right")
            table.add_column(f"b{b} vs eager", justify="right")
        table.add_column("max err", justify="right")
        expected, eager_ms = {}, {}
        with torch.inference_mode():
            for b in BATCHES:
                tensors = [torch.from_numpy(a).cuda() for a in inputs[b]]
                expected[b] = eager(*tensors).cpu().numpy()
                eager_runs[name] = functools.partial(eager, *tensors)  # the largest batch's, once done
                eager_ms[b] = timed(eager_runs[name], torch.cuda.synchronize)
        table.add_row("eager", "", *[c for b in BATCHES for c in (f"{eager_ms[b]:.3f}", "1.00x")], "0")
        program = export_program(load_torchscript(model.torchscript()), spec)
        for label, options in chosen.items():
            start = time.perf_counter()
            executable = tvm_cuda.build(program, target, **options)
            compile_s = time.perf_counter() - start
            function = relax.VirtualMachine(executable, device)["main"]
            cells, error = [], 0.0
            for b in BATCHES:
                args_ = [tvm.runtime.tensor(a, device) for a in inputs[b]]
                output = function(*args_)
                if not isinstance(output, tvm.runtime.Tensor):  # a tuple of one
                    output = output[0]
                error = max(error, float(np.abs(output.numpy() - expected[b]).max()))
                run = functools.partial(function, *args_)
                ms = timed(run, device.sync)
                cells += [f"{ms:.3f}", f"{ms / eager_ms[b]:.2f}x"]
                if b == max(BATCHES) and (name not in best or ms < best[name][0]):
                    best[name] = (ms, run, label)
            table.add_row(label, f"{compile_s:.1f}", *cells, f"{error:.1e}")
        console.print(table)

    if "resnet18" in best:
        ms, fastest, label = best["resnet18"]
        console.print(f"resnet18 b{max(BATCHES)}: the GPU kernels of eager, then of {label} ({ms:.3f} ms)")
        console.print(kernel_profile(eager_runs["resnet18"]))
        console.print(kernel_profile(fastest))


if __name__ == "__main__":
    main()
