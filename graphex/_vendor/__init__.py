"""Third-party code graphex carries so that its only runtime dependency stays torch.

flatbuffers/: the FlatBuffers Python runtime (version in flatbuffers/_version.py), Apache License 2.0,
copied unchanged from the `flatbuffers` package (https://github.com/google/flatbuffers, python/flatbuffers),
minus flexbuffers.py, which graphex does not use. graphex/fb/ (flatc's generated code) imports it from here
(`make schema` rewrites the imports).
"""
