"""The bench's conv net through torch.compile: graphex fused with and without frozen parameters, against inductor.

    python -m bench.convnet [--threads 1,2] [--rounds 15] [--image 64] [--layers]

Rows, each a torch.compile of its own copy of the model (bench/models.py build_convnet, eval, one [1, 3, H, W] image):
  graphex fused                      options={"pattern_fusion_pass": True}
  graphex fused, frozen, no prepack  ... "frozen_parameter": True, "prepack_conv_weights": False
  graphex fused, frozen              ... "frozen_parameter": True: convolutions on weights reordered once
                                     (Note [A frozen convolution weight is prepacked once]); `make bench`'s fused row
  inductor                           the default backend, as `make bench` compiles it
  inductor, freezing                 torch._inductor.config.freezing = True (its own weight prepacking and folding)
Each round times 10 calls of every row in turn (after 3 warm-up calls); the median of the rounds' medians is printed
with its ratio to inductor's, at each thread count, and each row's largest difference from eager.

--layers times each distinct convolution of the net alone instead, on a channels_last input of its size: ATen's
convolution against mkldnn::_convolution_pointwise on the weight reordered beforehand (what prepack_conv_weights
runs), median of 200 calls each after 20 warm-up calls, at each thread count.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any, Callable

import torch

ROWS = ("graphex fused", "graphex fused, frozen, no prepack", "graphex fused, frozen", "inductor", "inductor, freezing")


def _compiled(model: torch.nn.Module) -> dict[str, Callable[..., Any]]:
    import torch._inductor.config as inductor_config

    import graphex  # noqa: F401  (registers the backend)

    from .measure import configure_cold_inductor

    fused = {"pattern_fusion_pass": True}
    graphex_rows = {"graphex fused": fused,
                    "graphex fused, frozen, no prepack": {**fused, "frozen_parameter": True,
                                                          "prepack_conv_weights": False},
                    "graphex fused, frozen": {**fused, "frozen_parameter": True}}
    rows: dict[str, Callable[..., Any]] = {
        name: torch.compile(copy.deepcopy(model), backend="graphex", fullgraph=True, dynamic=False, options=options)
        for name, options in graphex_rows.items()}
    configure_cold_inductor()
    rows["inductor"] = torch.compile(copy.deepcopy(model), fullgraph=True, dynamic=False)
    frozen_model = copy.deepcopy(model)
    compiled = torch.compile(frozen_model, fullgraph=True, dynamic=False)

    def inductor_freezing(x: torch.Tensor) -> Any:  # freezing is read when the first call compiles
        with inductor_config.patch(freezing=True):
            return compiled(x)

    rows["inductor, freezing"] = inductor_freezing
    return rows


def measure(threads: list[int], rounds: int, image: int) -> None:
    from .models import build_convnet

    model = build_convnet()
    x = torch.randn(1, 3, image, image, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.set_num_threads(max(threads))
        want = model(x)
        rows = _compiled(model)
        for name, fn in rows.items():  # compile, and check
            diff = (fn(x) - want).abs().max().item()
            print(f"{name}: largest difference from eager {diff:.2g}")
        for n in threads:
            torch.set_num_threads(n)
            medians: dict[str, list[float]] = {name: [] for name in rows}
            for _ in range(rounds):
                for name, fn in rows.items():
                    for _ in range(3):
                        fn(x)
                    times = []
                    for _ in range(10):
                        start = time.perf_counter()
                        fn(x)
                        times.append(time.perf_counter() - start)
                    medians[name].append(statistics.median(times))
            base = statistics.median(medians["inductor"])
            print(f"\n{n} thread(s), [1, 3, {image}, {image}], median of {rounds} rounds of 10 calls:")
            for name, values in medians.items():
                m = statistics.median(values)
                print(f"  {name:36s} {m * 1e6:8.0f} us  {m / base:.2f}x inductor")


# The net's distinct convolutions at image 64 (bench/models.py ConvNet, width 32): in, out channels, input size,
# stride, kernel.
LAYERS = ((3, 32, 64, 1, 3), (32, 32, 32, 1, 3), (32, 64, 32, 2, 3), (64, 64, 16, 1, 3), (32, 64, 32, 2, 1),
          (64, 128, 16, 2, 3), (128, 128, 8, 1, 3), (64, 128, 16, 2, 1))


def _median_us(fn: Callable[[], Any], calls: int = 200) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def measure_layers(threads: list[int]) -> None:
    for n in threads:
        torch.set_num_threads(n)
        print(f"\n{n} thread(s): each convolution alone, channels_last input, median of 200 calls, us")
        print("  in -> out, image, stride, kernel        ATen   reordered weight")
        for cin, cout, size, stride, k in LAYERS:
            x = torch.randn(1, cin, size, size).contiguous(memory_format=torch.channels_last)
            w = torch.randn(cout, cin, k, k)
            pad, strides = [k // 2] * 2, [stride] * 2
            packed = torch.ops.mkldnn._reorder_convolution_weight(w, pad, strides, [1, 1], 1, list(x.shape))
            aten = _median_us(lambda: torch.ops.aten.convolution(x, w, None, strides, pad, [1, 1], False, [0, 0], 1))
            ours = _median_us(lambda: torch.ops.mkldnn._convolution_pointwise(x, packed, None, pad, strides, [1, 1], 1,
                                                                              "none", [], None))
            print(f"  {cin:3d} -> {cout:3d}, {size:2d}x{size:<2d}, {stride}, {k}x{k}           {aten:6.0f}   {ours:6.0f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.convnet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--image", type=int, default=64)
    p.add_argument("--layers", action="store_true", help="time each convolution alone, ATen's against prepacked")
    args = p.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    if args.layers:
        measure_layers(threads)
    else:
        measure(threads, args.rounds, args.image)


if __name__ == "__main__":
    main()
