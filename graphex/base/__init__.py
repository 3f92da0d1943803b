"""graphex's base helpers: what every layer may use, importing no layer of graphex (an import-linter contract,
pyproject.toml). One job per module:

    atomic.py          writing a file whole or not at all
    lazy.py            a package's public names imported on first use
    libraries.py       where `make build` puts graphex's optional shared libraries
    log.py             GRAPHEX_LOG and its levels
    source.py          where an FX node came from in the user's code
    warn.py            GraphexWarning, warned once, attributed to the user's frame
    weights_layout.py  what graphex's safetensors files hold besides tensors
"""
