"""Stand-in context binaries for the tiny bundles: ``ctx/`` files that only the test fake loads.

A real ``{component}{suffix}_socid77_archv73.bin`` is a QNN context compiled by QAIRT for the
HTP. These files have the same names and sizes above ``MIN_CONTEXT_BYTES`` but hold the
component's ONNX graph behind a small JSON header; only the fake ``qai_appbuilder`` in
``tests/fake_qai_appbuilder`` can load them (it runs the graph with onnxruntime and presents
float tensors as fp16, like a context compiled with fp16 I/O). The real library rejects them.

Format: ``FAKE_CONTEXT_MAGIC``, one JSON line (``graphs``: name, byte offset and size of each
ONNX payload counted from the end of that line, ``float_io``), the payloads, zero padding.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ..variants import COMPONENTS, VariantSpec

FAKE_CONTEXT_MAGIC = b"MOLMOACT2-FAKE-QNN-CONTEXT/1\n"
MIN_BYTES = 4096


def fake_context_bytes(graph_name: str, onnx_bytes: bytes, *, soc_id: int = 77,
                       dsp_arch: str = "v73", float_io: str = "float16") -> bytes:
    """One single-graph fake context holding ``onnx_bytes`` as graph ``graph_name``."""
    header = {
        "graphs": [{"name": graph_name, "offset": 0, "size": len(onnx_bytes)}],
        "float_io": float_io,
        "soc_id": soc_id,
        "dsp_arch": dsp_arch,
        "note": "molmoact2_ros test stand-in, loadable only by tests/fake_qai_appbuilder",
    }
    body = FAKE_CONTEXT_MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + onnx_bytes
    return body + b"\0" * max(0, MIN_BYTES - len(body))


def write_fake_contexts(
    bundle_dir: Path, variant: VariantSpec, suffixes: Sequence[str] = ("", "_w4a16")
) -> list[Path]:
    """Write ``ctx/{component}{suffix}_socid77_archv73.bin`` for every component and suffix.

    Every suffix wraps the same fp16-I/O graph from ``onnx/<dir>/model.onnx`` (quantised
    sets ship no ONNX; their I/O is fp16 too).
    """
    bundle_dir = Path(bundle_dir)
    folder = bundle_dir / "ctx"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for component in COMPONENTS:
        onnx_bytes = (bundle_dir / "onnx" / variant.onnx_dir(component) / "model.onnx").read_bytes()
        data = fake_context_bytes(
            component, onnx_bytes, soc_id=variant.soc_id, dsp_arch=variant.dsp_arch
        )
        for suffix in suffixes:
            path = folder / variant.context_file(component, suffix)
            path.write_bytes(data)
            written.append(path)
    return written
