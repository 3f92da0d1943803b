"""Note [Bad files never crash] (tests/fuzz/fuzz_load.cpp): libFuzzer, coverage-guided, on
graphex::Module::load (program.gxp + weights.safetensors from arbitrary bytes), built with clang and
AddressSanitizer (tests/fuzz/CMakeLists.txt, into build/fuzz), run for a bounded 20 s from the corpus kept in
tests/fuzz/corpus. Any crash, sanitizer report, leak or hang fails the test with the reproducer's path.
The first build takes a few minutes (later ones are incremental); `make fuzz-loader` runs it longer and
merges what it finds into the corpus."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, torch_cmake_defines

CLANG = shutil.which("clang++-19")
BUILD = os.path.join(ROOT, "build", "fuzz")


def _build() -> str:
    import torch

    cmake = shutil.which("cmake") or os.path.join(os.path.dirname(sys.executable), "cmake")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    launcher = [f"-DCMAKE_CXX_COMPILER_LAUNCHER={shutil.which('ccache')}"] if shutil.which("ccache") else []
    for cmd in ([cmake, "-S", os.path.join(ROOT, "tests", "fuzz"), "-B", BUILD, *generator, *launcher,
                 f"-DCMAKE_CXX_COMPILER={CLANG}", f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", *torch_cmake_defines()],
                [cmake, "--build", BUILD]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return os.path.join(BUILD, "fuzz_load")


def test_slow_libfuzzer_on_the_loader_finds_no_crash_in_20_s(tmp_path):
    # `make test` installs clang-19 (the Makefile's fuzz deps): missing is a failure, not a skip.
    assert CLANG is not None, "clang++-19 not installed: `make test` installs it (apt-get install clang-19 libfuzzer-19-dev)"
    fuzzer = _build()
    corpus = os.path.join(ROOT, "tests", "fuzz", "corpus")
    assert len(os.listdir(corpus)) >= 3
    (tmp_path / "new").mkdir()  # what this run finds goes here, not into the kept corpus
    proc = subprocess.run([fuzzer, str(tmp_path / "new"), corpus, "-max_total_time=20", "-timeout=10",
                           "-rss_limit_mb=4096", f"-artifact_prefix={tmp_path}/crash-"],
                          capture_output=True, text=True, timeout=180)
    crashes = [p for p in os.listdir(tmp_path) if p.startswith("crash-")]
    assert proc.returncode == 0 and not crashes, f"reproducers: {crashes}\n{proc.stderr[-4000:]}"
    done = [line for line in proc.stderr.splitlines() if line.startswith("Done ")]
    assert done and int(done[-1].split()[1]) > 100, proc.stderr[-2000:]  # "Done N runs in S second(s)"
