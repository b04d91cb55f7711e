"""TensorRT-LLM's suffix-automaton draft enhancer (``Eagle3DecodingConfig.sa_config``): the EAGLE-3
chain whose K drafts a row's suffix match overrides. Reference algorithm and sources: automaton.py."""

# The package imports nothing: its release table and rules are read by pipeline/ without torch;
# the method class is in .method (speculative/registry.py imports it).
