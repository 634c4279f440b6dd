"""srt-agent inside other systems: SGLang's speculative decoding (``sglang``)."""
