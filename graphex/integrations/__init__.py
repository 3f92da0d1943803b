"""graphex from other libraries' entry points.

    transformers.py   compile_config(): a transformers CompileConfig that makes generate() compile its decode
                      step with graphex, on the CPU too (docs/transformers.md)
"""
