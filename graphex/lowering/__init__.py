"""The lowering layer: an ATen-level FX graph becomes a typed Program (graphex/program/typed.py) for the C++ core.

  lower  LoweredGraph and lower(): a slot per value, a node per call (Note [One typed program])
  fold   frozen_parameter's folding of the calls that read only frozen parameters (Note [Folding frozen parameters])
  prepack  fused mode with frozen_parameter: convolutions on weights reordered once for oneDNN
           (Note [A frozen convolution weight is prepacked once])
"""

from .lower import LoweredGraph, lower  # noqa: F401
