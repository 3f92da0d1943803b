"""Correctness sweeps of graphex against eager PyTorch, run by `make opinfo` and `make fuzz`.

compare.py        bitwise comparison of nested results (NaN payloads and -0.0 included)
opinfo_cases.py   which OpInfo samples to run, as flat tensor arguments
opinfo_classify.py  one case under graphex (and aot_eager when it fails), classified
opinfo.py         `python -m sweeps.opinfo`: the sweep, progress, the markdown + JSON table
fuzz_gen.py       random programs (Python source) over a fixed menu of ops; merging several into one
fuzz_ops.py       the two custom operators fuzzed programs call (out-of-place and in place)
fuzz_run.py       one program under eager and graphex, compared; shrinking; reproducers
fuzz.py           `python -m sweeps.fuzz`: the fuzzer's command line
"""
