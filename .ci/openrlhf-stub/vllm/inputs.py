"""vllm.inputs stand-in: the prompt type OpenRLHF builds."""

from typing import TypedDict


class TokensPrompt(TypedDict, total=False):
    """A token-id prompt."""

    prompt_token_ids: list[int]
    multi_modal_data: dict[str, object]
