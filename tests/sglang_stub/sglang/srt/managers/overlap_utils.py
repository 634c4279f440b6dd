"""Stand-in of sglang/srt/managers/overlap_utils.py (0.5.23): FutureMap's constructor."""


class FutureMap:
    def __init__(
        self, device, spec_algorithm, req_to_token_pool, needs_cpu_seq_lens=True, needs_confidence_relay=False
    ):
        self.device = device
        self.spec_algorithm = spec_algorithm
        self.req_to_token_pool = req_to_token_pool
        self.needs_cpu_seq_lens = needs_cpu_seq_lens
        self.needs_confidence_relay = needs_confidence_relay
