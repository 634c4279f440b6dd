"""The utils of flash-attn that OpenRLHF imports."""
