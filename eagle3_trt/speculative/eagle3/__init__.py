"""The EAGLE-3 chain and static tree (``eagle_choices``): TensorRT-LLM's one-model EAGLE-3.

Its reference algorithm is the engine's own drafting, shared by every EAGLE-family method:
``core/drafting.py`` (``Drafter``, ``StaticTreeRun``), ``core/tree.py`` (the static tree) and
``core/verify.py`` (acceptance); it stays in core because the decoding loop drafts with it when
it is handed no method. This home registers it and holds what is about the method alone.
"""

# The package imports nothing: its release table and rules are read by pipeline/ without torch;
# the method class is in .method (speculative/registry.py imports it).
