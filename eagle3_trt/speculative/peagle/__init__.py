"""P-EAGLE (parallel drafting): the head proposes all K draft tokens in one forward, the first from the
bonus token and the other K-1 from mask slots.

Who trains it, who serves it (read in their sources):

- speculators 0.9.0 trains and saves it: ``speculators_model_type: peagle`` (``models/peagle/config.py``:
  ``mask_token_id``, ``embed_requires_grad`` true), ``models/peagle/core.py`` (``PEagleDraftModel``: the
  EAGLE-3 draft plus a learned ``mask_hidden`` [1, 1, A*T] and a trained ``embed_tokens``; training samples
  COD groups, ``data.py``, under ``attention.py``'s mask). Read here: ``head_config``, ``checkpoint``.
- vLLM serves it: ``vllm/transformers_utils/configs/speculators/base.py`` @
  052316aeab2a1b2a9076518f20fe776052b947c9 maps ``peagle`` to ``method: eagle3, parallel_drafting: true``;
  the proposer is ``vllm/v1/spec_decode/llm_base_proposer.py`` @ 00c4f22dae4795e34658bead82fa071e6bb7ae39
  with ``copy_and_expand_eagle_inputs_kernel`` (``vllm/v1/spec_decode/utils.py`` @
  01046b9a33846d0561525a552c3c540ef9f56db0). Implemented here: ``draft`` (the pass), ``method`` (the step).
- SGLang: the stored ``sgl-project/sglang`` ``python/sglang/srt/speculative/spec_info.py`` @
  009db01a7c0d5460611d543516401eb497641918 has no P-EAGLE algorithm (EAGLE, EAGLE3 only); a
  ``PEAGLE``/``PEAGLE_DSL`` worker exists only as a third-party port, not in a release read here. Not a
  bundle target.
- TensorRT-LLM: no release serves P-EAGLE. ``_torch/speculative/`` has EAGLE-3, MTP, DFlash, DSpark, PARD,
  ...; PARD (``pard.py`` @ 051edebb761177165b477835167762b73cdd3114) is parallel drafting by a
  target-independent draft model ("relies only on its own embeddings and mask tokens, not target hidden
  states"), so a P-EAGLE head (fc over the target's aux states, ``mask_hidden``) cannot run in it. The
  EAGLE-3 path refuses a P-EAGLE head in one line saying so (``formats.draft_producers``).

Only ``speculative/registry.py`` imports this home (an import-linter contract says so): everything
outside asks the registry for the method of a head (``method_for_head``: ``PEagleMethod.head``), of a
bundle's options (``method_from_options``) or of a name, and calls its hooks. Outside this folder,
P-EAGLE is named only by the registry's line, the bundle options' vLLM key (``pipeline/llm_options.py``
``parallel_drafting``) and speculators' format table (``formats/draft_producers.py``); tests/
test_method_homes.py checks that and runs the package with this folder removed.

Like every method package, this ``__init__`` imports nothing; the class is ``peagle.method.PEagleMethod``.
"""
