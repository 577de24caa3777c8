"""Stand-in context binaries for the tiny bundles: ``ctx/`` files that only the test fake loads.

A real ``{component}{suffix}_socid77_archv73.bin`` is a QNN context compiled by QAIRT for the
HTP. These files have the same names and sizes above ``MIN_CONTEXT_BYTES`` but hold the
component's ONNX graph behind a small JSON header; only the fake ``qai_appbuilder`` in
``tests/fake_qai_appbuilder`` can load them (it runs the graph with onnxruntime and presents
float tensors as fp16, like a context compiled with fp16 I/O). The real library rejects them.

Format: ``FAKE_CONTEXT_MAGIC``, one JSON line (``graphs``: name, byte offset and size of each
ONNX payload counted from the end of that line and, for quantized I/O, ``quant``: per tensor
``dtype`` ufp16, ``scale``, ``offset``; ``float_io``), the payloads, zero padding.

The ``_w4a16`` set has quantized I/O, as the converter makes by default: every float input and
output is ``ufp16`` with a scale and offset calibrated on the component's golden I/O (twice its
range, at least ±``MIN_RANGE`` so the flow loop's noise and timesteps fit; zero exactly
representable). action_context has no ``_w4a16`` context: as in the
reference runtime, the action suffix selects action_step only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..bundle.variants import ACTION_CONTEXT, COMPONENTS, VariantSpec

FAKE_CONTEXT_MAGIC = b"MOLMOACT2-FAKE-QNN-CONTEXT/1\n"
MIN_BYTES = 4096


QUANTIZED_SUFFIXES = ("_w4a16",)
MIN_RANGE = 6.0


def fake_context_bytes(graph_name: str, onnx_bytes: bytes, *, soc_id: int = 77,
                       dsp_arch: str = "v73", float_io: str = "float16",
                       quant: Mapping[str, Mapping] | None = None) -> bytes:
    """One single-graph fake context holding ``onnx_bytes`` as graph ``graph_name``."""
    graph: dict = {"name": graph_name, "offset": 0, "size": len(onnx_bytes)}
    if quant:
        graph["quant"] = {k: dict(v) for k, v in quant.items()}
    header = {
        "graphs": [graph],
        "float_io": float_io,
        "soc_id": soc_id,
        "dsp_arch": dsp_arch,
        "note": "molmoact2_ros test stand-in, loadable only by tests/fake_qai_appbuilder",
    }
    body = FAKE_CONTEXT_MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + onnx_bytes
    return body + b"\0" * max(0, MIN_BYTES - len(body))


def ufp16_params(low: float, high: float) -> dict:
    """Scale/offset of a ufp16 tensor covering [low, high] with 0.0 exactly representable."""
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    scale = max(high - low, 1e-6) / 65535.0
    return {"dtype": "ufp16", "scale": scale, "offset": int(round(low / scale))}


def calibrated_quant(golden_npz: Path) -> dict[str, dict]:
    """ufp16 parameters for every float tensor of a component's golden I/O (see above)."""
    quant = {}
    with np.load(golden_npz, allow_pickle=False) as data:
        for name in data.files:
            values = data[name]
            if values.dtype.kind != "f" or values.size == 0:
                continue
            finite = values[np.isfinite(values)]
            low = float(finite.min()) if finite.size else 0.0
            high = float(finite.max()) if finite.size else 0.0
            quant[name] = ufp16_params(min(2.0 * low, -MIN_RANGE), max(2.0 * high, MIN_RANGE))
    return quant


def write_fake_contexts(
    bundle_dir: Path, variant: VariantSpec, suffixes: Sequence[str] = ("", "_w4a16")
) -> list[Path]:
    """Write ``ctx/{component}{suffix}_socid77_archv73.bin`` for every component and suffix.

    Every suffix wraps the same graph from ``onnx/<dir>/model.onnx``; "" has fp16 I/O, the
    quantized suffixes ufp16 I/O (see the module docstring) and no action_context context.
    """
    bundle_dir = Path(bundle_dir)
    folder = bundle_dir / "ctx"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for component in COMPONENTS:
        onnx_bytes = (bundle_dir / "onnx" / variant.onnx_dir(component) / "model.onnx").read_bytes()
        for suffix in suffixes:
            quant = None
            if suffix in QUANTIZED_SUFFIXES:
                if component == ACTION_CONTEXT:
                    continue
                quant = calibrated_quant(bundle_dir / "golden" / f"{component}_io.npz")
            data = fake_context_bytes(
                component, onnx_bytes, soc_id=variant.soc_id, dsp_arch=variant.dsp_arch,
                quant=quant,
            )
            path = folder / variant.context_file(component, suffix)
            path.write_bytes(data)
            written.append(path)
    return written
