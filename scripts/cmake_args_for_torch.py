"""Print the extra pip `-C` settings needed to build graphex against the torch of this interpreter.

A CUDA build of torch makes `find_package(Torch)` look for the CUDA toolkit and for
libnvrtc. The toolkit comes from CUDA_HOME (or /usr/local/cuda); the pip wheels ship
libnvrtc only as `nvidia/*/lib/libnvrtc.so.N`, which CMake's find_library does not
match, so it is passed by path. A CPU build of torch needs nothing: prints nothing.
Used by `make test-torch`; `--defines` prints them as `-D` arguments, and tests that configure CMake
projects of their own import `cmake_defines()`.
"""

from __future__ import annotations

import glob
import os
import site
import sys

import torch


def cmake_defines() -> list[str]:
    """The same settings as plain CMake `-D` arguments (for projects configured directly with cmake)."""
    return ["-D" + a.removeprefix("-Ccmake.define.") for a in _settings()]


def _settings() -> list[str]:
    if not torch.version.cuda:
        return []
    args = []
    root = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    if os.path.isdir(root):
        args.append(f"-Ccmake.define.CUDA_TOOLKIT_ROOT_DIR={root}")
    for packages in site.getsitepackages():
        found = sorted(glob.glob(os.path.join(packages, "nvidia", "*", "lib", "libnvrtc.so*")))
        if found:
            args.append(f"-Ccmake.define.CUDA_nvrtc_LIBRARY={found[0]}")
            break
    return args


def main() -> int:
    print(" ".join(cmake_defines() if "--defines" in sys.argv[1:] else _settings()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
