"""Stand-in of sglang/srt/speculative/spec_registry.py (0.5.23): the registry of custom algorithms."""

_REGISTRY = {}
_RESERVED = {"EAGLE", "EAGLE3", "NGRAM", "STANDALONE", "NONE", "NEXTN"}


class CustomSpecAlgo:
    def __init__(self, name, factory, *, supports_overlap=False, validate_server_args=None):
        self.name = name.upper()
        self.factory = factory
        self.supports_overlap = supports_overlap
        self.validate_server_args = validate_server_args

    def is_ngram(self):
        return False

    def has_draft_kv(self):
        return True

    def handle_server_args(self, server_args):
        pass

    def create_worker(self, server_args):
        if not server_args.disable_overlap_schedule and not self.supports_overlap:
            raise ValueError(f"Speculative algorithm {self.name} does not support overlap scheduling.")
        return self.factory(server_args)


def register_algorithm(
    name, factory, *, supports_overlap=False, validate_server_args=None, spec_class=CustomSpecAlgo
):
    upper = name.upper()
    if upper in _RESERVED:
        raise ValueError(f"{name!r} is a reserved speculative algorithm name")
    if upper in _REGISTRY:
        raise ValueError(f"speculative algorithm {name!r} is already registered")
    if not issubclass(spec_class, CustomSpecAlgo):
        raise TypeError("spec_class must subclass CustomSpecAlgo")
    _REGISTRY[upper] = spec_class(
        upper, factory, supports_overlap=supports_overlap, validate_server_args=validate_server_args
    )
    return factory


def get_spec(name):
    return _REGISTRY.get(name.upper())
