"""Stand-in of sglang/srt/speculative/spec_info.py (0.5.23): SpeculativeAlgorithm.register."""

from sglang.srt.speculative.spec_registry import CustomSpecAlgo, get_spec, register_algorithm


class SpeculativeAlgorithm:
    @classmethod
    def register(cls, name, *, supports_overlap=False, validate_server_args=None, spec_class=CustomSpecAlgo):
        def decorator(factory):
            register_algorithm(
                name,
                factory,
                supports_overlap=supports_overlap,
                validate_server_args=validate_server_args,
                spec_class=spec_class,
            )
            return factory

        return decorator

    @classmethod
    def from_string(cls, name):
        spec = get_spec(name)
        if spec is None:
            raise ValueError(f"Unknown speculative algorithm name: {name}")
        return spec
