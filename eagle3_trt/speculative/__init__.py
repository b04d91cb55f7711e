"""Speculation methods: one home each, registered in one table.

Layout (learned from TensorRT-LLM's ``tensorrt_llm/_torch/speculative/``: ``interface.py``
``SpeculativeDecodingMode`` names the modes and ``utils.py`` ``get_spec_metadata`` /
``get_spec_worker`` / ``get_spec_drafter`` map a mode to its classes; and from speculators'
``src/speculators/models/``: one module per model type, registered by name)::

    eagle3_trt/speculative/
        registry.py          METHODS: name -> method class (the one table), method_from_options()
        release_keys.py      shared by the release tables: which keys a TensorRT-LLM release lacks
        eagle3/              the EAGLE-3 chain and static tree (eagle_choices)
            method.py        Eagle3Chain (its run: core/static_tree_run.py, the engine's own drafting)
            release.py       eagle3_model_arch / spec_dec_variant by release
            sampling_release.py  the speculative sampling flags by release
            cost.py          cost-model hook: one iteration's time
        sa/                  TensorRT-LLM's suffix-automaton draft enhancer (sa_config)
            cost.py          cost-model hook: the chain's (the automaton runs no forward)
            automaton.py     reference algorithm (SuffixAutomaton, SAEnhancer, SAConfig), sources cited
            method.py        SuffixAutomatonMethod
            options.py       SAEnhancerOptions (the bundle's sa_config schema)
            release.py       sa_config by release (refused / left out of launch files before 1.3)
        dynamic_tree/        TensorRT-LLM's EAGLE-3 dynamic tree (use_dynamic_tree)
            builder.py       reference algorithm: the per-row tree (DynamicTreeBuilder), sources cited
            drafting.py      reference algorithm: its draft loop
            rules.py         DynamicTreeConfig and TensorRT-LLM's ranges/refusals (no torch)
            method.py        DynamicTreeMethod
            options.py       the options' rules (pipeline/llm_options.Eagle3Options calls them)
            release.py       use_dynamic_tree by release
            mode.py          measurement hook: ``alpha --modes dynamic-tree``
            cost.py          cost-model hook: one iteration's time
        <method>/            every further method: its own folder, its ``__init__`` says what it holds
                             and which engine serves it (registry.METHODS lists them all)

A method's home holds everything about it: its method class, implementing
``core.method_api.SpeculationMethod`` (``start`` -> a ``MethodRun`` with ``draft`` /
``tree_valid`` / ``after_verify``), the ONE interface the decoding loop (``core/engine.py``) calls.
The engine is handed the method object (``SpeculativeEngine(..., method=m)``, ``engine.method = m``
or ``with engine.using(m): ...``; ``None`` is the EAGLE-3 chain / static tree); core never imports
a method, so the import-linter layers hold (speculative sits between convert and core, and is
mypy-strict). ``from_options(spec, at_bundle_k)`` builds the method from a bundle's
``speculative_config`` (None when the options do not select it); ``runtime/loader.py`` asks
``registry.method_from_options``. Beside it: its options schema, its release table (which
TensorRT-LLM / vLLM release takes which key), its reference algorithm (pure tensor code, exactly as
the serving engine runs it, source file and commit cited) and its hooks for measurement, the cost
model and recommendation. The cost hook is the class's ``step_seconds`` (its home's ``cost.py``: one
iteration's time from the roofline's forward times); measure/cost_model.py prices every method through
``registry.step_cost(name)``, so ``recommend`` and ``alpha --against`` choose among methods and K
without naming any (measure/method_choice.py).

A method package's ``__init__`` imports nothing: pipeline/ reads the rules, options and release
tables without torch; import the class from ``<method>.method``.

Adding a method (``speculative/<method>/``): create the folder with a method class
(``name = "<method>"``, ``from_options``, ``served_sampling``, ``start`` returning a ``MethodRun``,
``step_seconds`` from its ``cost.py``),
add ONE line to ``registry.METHODS``, and add its tests (tests/test_speculative_registry.py checks
every registered method's name and interface). A method with its own head format sets ``head`` hooks
(``claims``/``load`` the checkpoint, ``check_target``, ``build``, ``slot_logits``, ``export``, ``serving``:
engine -> how it is told or why not, ``trtllm_refusal``, ``speculative_options``) and, if it trains one,
``training`` hooks (``summary``, ``mask_slots``, ``check``, ``make_head``, ``unroll``, ``files``): the
loader, validate, the bundle build, the launchers, compile/Triton and train-draft call those, never the
method's name. Only registry.py imports such a home (a pyproject.toml import-linter contract;
tests/test_method_homes.py runs the package with that home removed).

Still outside the homes: the chain/static tree's reference drafting stays in core (core/drafting.py,
core/tree.py, core/verify.py: every EAGLE-family method drafts and verifies with it); the
recommendation glue that reads alpha reports and bundles (measure/dynamic_tree_choice.py,
measure/sampling_choice.py, measure/recommendation.py) lives in measure/, above pipeline.
"""
