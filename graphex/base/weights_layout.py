"""What graphex's safetensors files hold besides tensors, known to every reader (no torch here: graphex inspect
reads the header with json alone).

PAD_PREFIX: Note [Weights are 64-byte aligned] (csrc/deploy/safetensors.h, whose kPaddingPrefix is the same
string). A writer fills the zero bytes between two tensors with an entry of this prefix (dtype U8, shape [the gap]),
so the data section is covered without gaps as huggingface's safetensors reader requires; graphex's readers and
everything that lists weights skip entries whose name starts with it, and a tensor named so is refused on write.
"""

PAD_PREFIX = "__graphex_pad_"


def is_padding(name: str) -> bool:
    """Whether a safetensors entry is a padding entry (Note [Weights are 64-byte aligned])."""
    return name.startswith(PAD_PREFIX)
