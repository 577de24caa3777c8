"""Variants as data and the cross-session chain check (docs/architecture.md, docs/runtime.md)."""

from __future__ import annotations

import dataclasses

import pytest

from molmoact2_ros.bundle.variants import COMPONENTS, VARIANTS, get_variant
from molmoact2_ros.errors import ContractError
from molmoact2_ros.runtime.null_backend import REAL_GEOMETRY, null_sessions
from molmoact2_ros.runtime.session import SessionSet, TensorInfo


def test_variant_table():
    assert {v: (s.seq_len, s.image_tokens_per_camera, s.default_flow_steps)
            for v, s in VARIANTS.items()} == {
        "grid_sampler": (128, 16, 10),
        "lp_vtp_sd": (130, 16, 2),
        "fused": (488, 196, 10),
    }
    grid = get_variant("grid_sampler")
    assert grid.patches_per_image == 729 and grid.patch_dim == 588
    assert grid.context_file("llm_split2", "_w4a16") == "llm_split2_w4a16_socid77_archv73.bin"
    assert VARIANTS["fused"].onnx_dir("vision") == "vision_fused"
    with pytest.raises(ContractError, match="choose one of: grid_sampler"):
        get_variant("gridsampler")


@pytest.mark.parametrize("name", list(VARIANTS))
def test_real_geometry_chains(name):
    variant = VARIANTS[name]
    sessions = SessionSet(null_sessions(variant), variant)
    g = sessions.geometry
    assert g.seq_len == variant.seq_len and g.hidden == 2560 and g.num_layers == 36
    assert g.layers_per_split == (9, 9, 9, 9)
    assert g.image_tokens == variant.image_tokens


def test_fused_as_shipped_is_refused_naming_both_tensors():
    """The published fused bundle pairs 392-token vision with S=128 LLM contexts."""
    fused, grid = VARIANTS["fused"], VARIANTS["grid_sampler"]
    sessions = null_sessions(grid)
    sessions["vision"] = null_sessions(fused)["vision"]
    sessions["action_step"] = null_sessions(fused)["action_step"]
    with pytest.raises(ContractError) as err:
        SessionSet(sessions, fused)
    msg = str(err.value)
    assert "vision output image_embeds[392,2560]" in msg
    assert "llm_split0 input hidden_states[1,128,2560]" in msg


def _replace(session, kind, name, shape):
    infos = tuple(
        TensorInfo(i.name, shape, i.dtype) if i.name == name else i for i in getattr(session, kind)
    )
    setattr(session, kind, infos)


def test_kv_width_mismatch_names_both_tensors():
    variant = VARIANTS["grid_sampler"]
    sessions = null_sessions(variant)
    _replace(sessions["action_context"], "inputs", "keys", (36, 1, 128, 512))
    with pytest.raises(ContractError, match=r"action_context input keys\[36,1,128,512\].*KV=512.*"
                       r"llm_split0 output keys\[9,1,128,1024\]"):
        SessionSet(sessions, variant)


def test_layer_count_mismatch():
    variant = VARIANTS["grid_sampler"]
    geometry = {**REAL_GEOMETRY, "L3": 8}
    sessions = null_sessions(variant, geometry=geometry)
    with pytest.raises(ContractError, match="emit 35 layers .* expects 36"):
        SessionSet(sessions, variant)


def test_action_context_output_must_match_action_step_input():
    variant = VARIANTS["lp_vtp_sd"]
    sessions = null_sessions(variant)
    _replace(sessions["action_step"], "inputs", "v_ctx", (36, 1, 130, 8, 64))
    with pytest.raises(ContractError, match="action_step input v_ctx.*AD=64.*action_context"):
        SessionSet(sessions, variant)


def test_wrong_variant_for_sessions():
    sessions = null_sessions(VARIANTS["lp_vtp_sd"])
    with pytest.raises(ContractError, match="variant grid_sampler needs 128"):
        SessionSet(sessions, VARIANTS["grid_sampler"])


def test_missing_tensor_and_bad_dtype():
    variant = VARIANTS["grid_sampler"]
    sessions = null_sessions(variant)
    s = sessions["llm_split1"]
    s.outputs = tuple(o for o in s.outputs if o.name != "values")
    with pytest.raises(ContractError, match="llm_split1 has no output named 'values'"):
        SessionSet(sessions, variant)
    sessions = null_sessions(variant)
    s = sessions["vision"]
    s.inputs = (dataclasses.replace(s.inputs[0], dtype="int32"),)
    with pytest.raises(ContractError, match="vision input pixel_values.*dtype int32"):
        SessionSet(sessions, variant)


def test_every_component_has_a_contract():
    for variant in VARIANTS.values():
        assert set(variant.contracts()) == set(COMPONENTS)
        assert variant.contracts(euler_in_graph=False)["action_step"].outputs[0].name == "velocity"


@pytest.mark.parametrize("flat_step", [False, True])
def test_flat_k_ctx_is_accepted_and_the_shape_used_is_named(flat_step):
    """The real action_context may emit k_ctx/v_ctx flat; the reference runtime reshapes them
    to [36,1,S,8,96]. Accepted flat ([N]) or 4-D, with the shape taken named in the geometry;
    a flat tensor of the wrong size is refused with the shape it needed."""
    variant = VARIANTS["grid_sampler"]
    sessions = null_sessions(variant)
    n = 36 * 128 * 8 * 96
    for name in ("k_ctx", "v_ctx"):
        _replace(sessions["action_context"], "outputs", name, (n,))
        if flat_step:
            _replace(sessions["action_step"], "inputs", name, (36, 1, 128, 768))
    geometry = SessionSet(sessions, variant).geometry
    assert "action_context output k_ctx[" + str(n) + "]" in geometry.kv_ctx_shape
    assert "reshaped to [36,1,128,8,96]" in geometry.kv_ctx_shape
    assert ("the reference runtime's heads" in geometry.kv_ctx_shape) == flat_step
    _replace(sessions["action_context"], "outputs", "v_ctx", (n - 96,))
    with pytest.raises(ContractError, match=r"v_ctx\[" + str(n - 96) + r"\] float32 has "
                       + str(n - 96) + r" elements but \[L,1,S,AH,AD\] = \[36,1,128,8,96\]"):
        SessionSet(sessions, variant)


def test_five_d_k_ctx_names_no_reshape():
    variant = VARIANTS["lp_vtp_sd"]
    assert SessionSet(null_sessions(variant), variant).geometry.kv_ctx_shape == ""
