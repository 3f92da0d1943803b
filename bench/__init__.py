"""The graphex benchmark suite: `python -m bench.run` (`make bench`); see bench/README.md."""
