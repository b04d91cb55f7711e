"""TensorRT-LLM's EAGLE-3 dynamic tree (``use_dynamic_tree``, ``dynamic_tree_max_topK``,
``max_total_draft_tokens``): a tree built per step and per row from the draft's probabilities."""

# The package imports nothing: its release table and rules are read by pipeline/ without torch;
# the method class is in .method (speculative/registry.py imports it).
