"""The npugraph_ex seed templates (../../../shared/seeds/npugraph-ex-template.txt), runnable on the CPU.

Each file is the template with its placeholders filled in and only the device changed
(`.npu()` -> `.cpu()`, `device_types="npu"` -> `"cpu"`); docs/npugraph-ex.md lists every
line that differs and why. tests/python/test_seeds.py runs them.
"""
