"""make deploy-demo: the shipped decoder (examples/models/decoder.py) exported, then generated from in C++.

    python -m examples.deploy.demo [--steps N] [--work DIR] [--plain-ops]

1. graphex.export writes WORK/decoder.graphex (program + weights) and WORK/state.safetensors (the first
   step's inputs: tokens, pos, zero KV caches).
2. `cmake --install build/py --component deploy --prefix WORK/prefix` installs the graphex package;
   examples/deploy is configured against it (find_package(graphex)) and built: WORK/build/decode. By
   default the decoder uses the C++ example operators (examples/ops), and decode links their library in.
3. decode (C++, no Python) generates N tokens; they must equal eager PyTorch's greedy tokens.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ["GRAPHEX_BUILD_DIR"]) if os.environ.get("GRAPHEX_BUILD_DIR") else ROOT / "build" / "py"


def _run(cmd: list[str], **kw) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    if proc.returncode != 0:
        raise SystemExit(f"deploy-demo: {' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def export_decoder(work: Path, custom_ops: bool) -> tuple[Path, Path, object]:
    """Export the shipped decoder; returns (artifact, state file, model)."""
    import torch

    import graphex
    from graphex.exporting import safetensors_bytes
    from examples.models.decoder import DecoderConfig, build_decoder

    model = build_decoder(DecoderConfig(custom_ops=custom_ops))
    k, v = model.new_cache()
    tokens, pos = torch.tensor([[1]]), torch.tensor([0])
    artifact = Path(graphex.export(model, (tokens, pos, k.clone(), v.clone()), work / "decoder.graphex"))
    state = work / "state.safetensors"
    state.write_bytes(safetensors_bytes({"tokens": tokens, "pos": pos, "k_cache": k, "v_cache": v}))
    return artifact, state, model


def eager_tokens(model, steps: int) -> list[int]:
    import torch

    from examples.models.decoder import decode

    with torch.no_grad():
        return [int(logits[0, -1].argmax()) for logits in decode(model, steps, prompt_token=1)]


def build_decode(work: Path, ops_library: Path | None) -> Path:
    """Install the graphex package from the build tree and build examples/deploy against it."""
    if not (BUILD / "CMakeCache.txt").exists():
        raise SystemExit("deploy-demo: graphex is not built (make build)")
    cmake = shutil.which("cmake") or str(Path(sys.executable).parent / "cmake")
    prefix = work / "prefix"
    _run([cmake, "--install", BUILD, "--component", "deploy", "--prefix", prefix])
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = [cmake, "-S", ROOT / "examples" / "deploy", "-B", work / "build", *generator,
                 f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release", *_torch_cmake_defines(),
                 f"-DGRAPHEX_OPS_LIBRARY={ops_library or ''}"]
    launcher = shutil.which("ccache")
    if launcher:
        configure.append(f"-DCMAKE_CXX_COMPILER_LAUNCHER={launcher}")
    _run(configure)
    _run([cmake, "--build", work / "build"])
    return work / "build" / "decode"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.deploy.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "deploy-demo")
    parser.add_argument("--plain-ops", action="store_true", help="the decoder without the C++ example operators")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)

    artifact, state, model = export_decoder(args.work, custom_ops=not args.plain_ops)
    expected = eager_tokens(model, args.steps)
    ops_library = None
    if not args.plain_ops:
        from examples import ops

        ops_library = ops.library_path()
    decode = build_decode(args.work, ops_library)
    out = _run([decode, artifact, state, args.steps])
    got = [int(t) for t in next(line for line in out.splitlines() if line.startswith("tokens:")).split()[1:]]
    print(f"C++ (graphex::Module, {decode}):\n  {' '.join(map(str, got))}")
    print(f"Python (eager):\n  {' '.join(map(str, expected))}")
    print(next(line for line in out.splitlines() if line.startswith("load:")))
    if got != expected:
        print("deploy-demo: the C++ tokens differ from Python's", file=sys.stderr)
        return 1
    print(f"deploy-demo: {args.steps} tokens, C++ equal to Python")
    return 0


def _torch_cmake_defines() -> list[str]:
    """What find_package(Torch) needs for this torch (a CUDA build: the toolkit and pip's libnvrtc)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("cmake_args_for_torch", os.path.join(str(ROOT), "scripts", "cmake_args_for_torch.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cmake_defines()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
