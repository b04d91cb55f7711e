"""Speculation methods: one home each, registered in one table.

Layout (learned from TensorRT-LLM's ``tensorrt_llm/_torch/speculative/``: ``interface.py``
``SpeculativeDecodingMode`` names the modes and ``utils.py`` ``get_spec_metadata`` /
``get_spec_worker`` / ``get_spec_drafter`` map a mode to its classes; and from speculators'
``src/speculators/models/``: one module per model type, registered by name)::

    eagle3_trt/speculative/
        registry.py          METHODS: name -> method class (the one table), method_from_options()
        eagle3/              the EAGLE-3 chain and static tree (eagle_choices): the engine's own drafting
        sa/                  TensorRT-LLM's suffix-automaton draft enhancer (sa_config)
        dynamic_tree/        TensorRT-LLM's EAGLE-3 dynamic tree (use_dynamic_tree)
        <method>/            ... one folder per method

A method's home holds everything about it:

- its method class: implements ``core.method_api.SpeculationMethod`` (``start`` -> a
  ``MethodRun`` with ``draft`` / ``tree_valid`` / ``after_verify``) — the ONE interface the
  decoding loop (``core/engine.py``) calls. The engine is handed the method object
  (``SpeculativeEngine(..., method=m)`` or ``with engine.using(m): ...``); core never imports a
  method, so the import-linter layers hold (speculative sits between convert and core);
- ``from_options(spec, at_bundle_k)``: the method built from a bundle's ``speculative_config``
  (None when the options do not select it); ``runtime/loader.py`` asks the registry;
- its options schema and release table (which TensorRT-LLM / vLLM release takes which key);
- its reference algorithm: pure tensor code, exactly as the serving engine runs it, with the source
  file and commit cited in the docstrings;
- its hooks for measurement, the cost model and recommendation.

Adding a method (e.g. P-EAGLE in ``speculative/peagle/``): create the folder with a method class
(``name = "peagle"``, ``from_options``, ``served_sampling``, ``start`` returning a ``MethodRun``),
add ONE line to ``registry.METHODS``, and add its tests. Nothing else in the tree needs to change
for the engine to serve it.
"""
