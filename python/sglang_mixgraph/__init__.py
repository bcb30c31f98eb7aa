"""sglang-mixgraph: patches for SGLang's mixed chunked-prefill steps, loaded as an SGLang plugin."""

__version__ = "0.1.0"
