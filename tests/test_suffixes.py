"""Context suffixes as in the reference runtime: the action suffix selects action_step only."""

from __future__ import annotations

from molmoact2_ros.bundle.bundle import Bundle, Suffixes


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


def test_a_quantised_action_context_is_chosen_only_by_its_own_name(tiny_root, tmp_path):
    """A bundle may carry a quantised action_context; only context_suffix.action_context
    selects it, and a missing one is named with its file."""
    import shutil

    import pytest

    from molmoact2_ros.control.params import Settings, validate_changes
    from molmoact2_ros.errors import MolmoActError

    explicit = Suffixes.from_mapping({"action": "_w4a16", "action_context": "_w4a16"})
    assert explicit.for_component("action_context") == "_w4a16"
    assert explicit.for_component("action_step") == "_w4a16"
    bundle = Bundle.open(tiny_root / "grid_sampler")
    with pytest.raises(MolmoActError, match="action_context_w4a16_socid77_archv73.bin"):
        bundle.check_contexts(explicit)
    copy = tmp_path / "grid_sampler"
    shutil.copytree(tiny_root / "grid_sampler", copy, symlinks=True)
    shutil.copy(copy / "ctx" / "action_context_socid77_archv73.bin",
                copy / "ctx" / "action_context_w4a16_socid77_archv73.bin")
    Bundle.open(copy).check_contexts(explicit)
    settings = Settings().with_changes({"context_suffix.action_context": "_w4a16"})
    assert settings.suffixes()["action_context"] == "_w4a16"
    assert validate_changes({"context_suffix.action_context": "w4a16"}, Settings())[0] is False
