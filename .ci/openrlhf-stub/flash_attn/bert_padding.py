"""The padding helpers OpenRLHF imports (used only with packed samples; see the package doc)."""

from einops import rearrange

from flash_attn._absent import absent

index_first_axis = absent("bert_padding.index_first_axis")
pad_input = absent("bert_padding.pad_input")
unpad_input = absent("bert_padding.unpad_input")

__all__ = ["index_first_axis", "pad_input", "rearrange", "unpad_input"]
