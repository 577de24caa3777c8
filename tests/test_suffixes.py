"""Context suffixes as in the reference runtime: the action suffix selects action_step only."""

from __future__ import annotations

from molmoact2_ros.bundle import Bundle, Suffixes


def test_action_suffix_leaves_action_context_alone(tiny_root):
    suffixes = Suffixes(vision="_w4a16", llm="_w4a16", action="_w4a16")
    assert suffixes.for_component("action_step") == "_w4a16"
    assert suffixes.for_component("action_context") == ""
    assert suffixes.for_component("llm_split2") == "_w4a16"
    bundle = Bundle.open(tiny_root / "grid_sampler")
    assert not bundle.context_path("action_context", "_w4a16").exists()  # none shipped
    assert bundle.context_path("action_context", suffixes.for_component("action_context")) \
        .name == "action_context_socid77_archv73.bin"
    bundle.check_contexts(suffixes)  # complete without an action_context_w4a16 file
