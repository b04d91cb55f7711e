"""Hatch build hook: keep editable installs from copying the top-level folders.

A wheel copies convert/, build/, ... under eagle3_trt/ (force-include). An editable install
must not: eagle3_trt/__init__.py already finds them in the source tree, and a copied
site-packages/eagle3_trt/ would shadow the tree. Hatchling only skips force-include for
editable wheels when a hook supplies a replacement map, so we supply a one-file marker.
"""

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CustomBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if version == "editable":
            build_data["force_include_editable"] = {"hatch_build.py": "_eagle3_trt_editable_hook.py.txt"}
