"""Hatch build hook: keep editable installs from copying the data folders.

A wheel ships build/presets, convert/data, models/ and triton_repo/model as package data
under eagle3_trt/_data/ (force-include). An editable install must not: the checkout's
eagle3_trt/resources.py finds them in place, and a copied site-packages/eagle3_trt/ would
shadow the source package. Hatchling only skips force-include for editable wheels when a
hook supplies a replacement map, so we supply a one-file marker.
"""

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CustomBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if version == "editable":
            build_data["force_include_editable"] = {"hatch_build.py": "_eagle3_trt_editable_hook.py.txt"}
