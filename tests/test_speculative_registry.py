"""The speculation methods' one table (eagle3_trt/speculative/registry.py): every method is registered
under its own name and implements the interface the decoding loop calls (core/method_api.py); a
bundle's options select the method as TensorRT-LLM's keys say; the method homes' rules and release
tables load without torch (pipeline/ reads them)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eagle3_trt.core.method_api import SpeculationMethod
from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.llm_options import Eagle3Options
from eagle3_trt.speculative.dynamic_tree.method import DynamicTreeMethod
from eagle3_trt.speculative.dynamic_tree.rules import DynamicTreeConfig
from eagle3_trt.speculative.registry import DEFAULT_METHOD, METHODS, method_class, method_from_options
from eagle3_trt.speculative.sa.automaton import SAConfig
from eagle3_trt.speculative.sa.method import SuffixAutomatonMethod
from eagle3_trt.speculative.sa.options import SAEnhancerOptions


def test_every_method_is_registered_under_its_name_with_the_interface():
    assert DEFAULT_METHOD in METHODS
    for name, cls in METHODS.items():
        assert cls.name == name
        for hook in ("from_options", "served_sampling", "start"):
            assert callable(getattr(cls, hook, None)), f"{name}: no {hook}"
    assert isinstance(SuffixAutomatonMethod(SAConfig()), SpeculationMethod)
    assert isinstance(DynamicTreeMethod(DynamicTreeConfig(2)), SpeculationMethod)
    with pytest.raises(UserError, match="unknown speculation method 'medusa'"):
        method_class("medusa")


def test_the_options_select_the_method():
    assert method_from_options(Eagle3Options(max_draft_len=3)) is None  # the engine's own chain
    sa = Eagle3Options(max_draft_len=3, sa_config=SAEnhancerOptions(threshold=6, enable_global_pool=True))
    assert method_from_options(sa) == SuffixAutomatonMethod(SAConfig(threshold=6, enable_global_pool=True))
    dyn = Eagle3Options(max_draft_len=3, use_dynamic_tree=True, dynamic_tree_max_topK=4, max_total_draft_tokens=9)
    assert method_from_options(dyn) == DynamicTreeMethod(DynamicTreeConfig(4, 9))
    # at a K other than the bundle's (alpha --max-draft-len) the tree's node count may not fit: the chain is measured
    assert method_from_options(dyn, at_bundle_k=False) is None


def test_rules_and_release_tables_load_without_torch():
    code = (
        "import sys; import eagle3_trt.speculative.dynamic_tree.rules, eagle3_trt.speculative.dynamic_tree.release, "
        "eagle3_trt.speculative.eagle3.release, eagle3_trt.speculative.eagle3.sampling_release, eagle3_trt.speculative.sa.release, "
        "eagle3_trt.speculative.sa.options, eagle3_trt.speculative.dynamic_tree.options, eagle3_trt.pipeline.trtllm_versions; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
