"""Third-party code graphex carries so that its only runtime dependency stays torch.

flatbuffers/: the FlatBuffers Python runtime (version in flatbuffers/_version.py), Apache License 2.0,
copied unchanged from the `flatbuffers` package (https://github.com/google/flatbuffers, python/flatbuffers),
minus flexbuffers.py, which graphex does not use. graphex/fb/ (flatc's generated code) imports it from here
(`make schema` rewrites the imports).

The files stay as upstream wrote them, builder.py's 858 lines included, though graphex's own code is one job per
file: updating them is copying upstream's files over these, which a split would turn into a hand merge on every
update, and no graphex code is read in them.
"""
