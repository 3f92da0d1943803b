"""Where `make build` puts graphex's optional shared libraries (the example ops, the simulated device)."""

from __future__ import annotations

from pathlib import Path


def built_library(subdir: str, name: str, how_to_build: str) -> Path:
    """`name` installed next to graphex._C (graphex/<subdir>/), else in the build tree (build/py/);
    FileNotFoundError naming every place looked in and `how_to_build`."""
    import graphex

    candidates = [Path(p) / subdir / name for p in graphex.__path__]
    candidates.append(Path(__file__).resolve().parents[2] / "build" / "py" / name)
    for path in candidates:
        if path.exists():
            return path
    raise FileNotFoundError(f"{name} not found (looked in {', '.join(str(c) for c in candidates)}); {how_to_build}.")
