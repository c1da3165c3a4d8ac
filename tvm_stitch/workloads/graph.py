"""A small builder for ONNX graphs on top of ``onnx.helper`` (opset 18, float32 by default)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .inputs import Dist, set_input_dists

OPSET = 18


class GraphBuilder:
    """Collects inputs, seeded initializers and nodes, then makes a checked, shape-inferred model.

    Values are referred to by name; :meth:`op` returns the names of its outputs.
    """

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self._inputs: list[onnx.ValueInfoProto] = []
        self._initializers: list[onnx.TensorProto] = []
        self._nodes: list[onnx.NodeProto] = []
        self._dists: dict[str, Dist] = {}
        self._counter = 0

    def _fresh(self, stem: str) -> str:
        self._counter += 1
        return f"{stem}_{self._counter}"

    def input(
        self,
        name: str,
        shape: Sequence[int],
        dtype: type[np.generic] = np.float32,
        dist: Dist | None = None,
    ) -> str:
        """Declare a graph input; ``dist`` overrides the default value range of :func:`inputs`."""
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        self._inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        if dist is not None:
            self._dists[name] = dist
        return name

    def constant(self, value: float | Sequence[int] | np.ndarray, name: str | None = None,
                 dtype: type[np.generic] = np.float32) -> str:
        """An initializer holding ``value`` (a scalar, list or array) as ``dtype``."""
        array = np.asarray(value, dtype=dtype)
        name = name or self._fresh("const")
        self._initializers.append(numpy_helper.from_array(array, name))
        return name

    def weight(self, name: str, shape: Sequence[int], mean: float = 0.0, std: float = 1.0) -> str:
        """A float32 initializer drawn from the builder's seeded normal distribution."""
        return self.constant(self.rng.normal(mean, std, tuple(shape)), name)

    def axes(self, *axes: int) -> str:
        """An int64 initializer listing reduction axes (opset 18 takes them as an input)."""
        return self.constant(list(axes), self._fresh("axes"), np.int64)

    def op(self, op_type: str, *inputs: str, outputs: int | Sequence[str] = 1,
           **attrs: object) -> str | list[str]:
        """Add a node; returns its output name, or the list of names when it has several."""
        out_names = (
            [self._fresh(op_type.lower()) for _ in range(outputs)]
            if isinstance(outputs, int)
            else list(outputs)
        )
        node_name = self._fresh(op_type)
        self._nodes.append(helper.make_node(op_type, list(inputs), out_names, node_name, **attrs))
        return out_names[0] if len(out_names) == 1 else out_names

    def model(self, outputs: Sequence[str], doc: str = "") -> onnx.ModelProto:
        """The finished model with ``outputs`` as graph outputs, types filled by inference.

        Runs ``onnx.checker`` and strict shape inference, so a malformed graph fails here.
        """
        produced = {name: node.op_type for node in self._nodes for name in node.output}
        missing = [name for name in outputs if name not in produced]
        if missing:
            raise ValueError(f"outputs {missing} are not produced by any node")
        outs = [helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)
                for name in outputs]
        graph = helper.make_graph(
            self._nodes, self.name, self._inputs, outs, self._initializers, doc_string=doc
        )
        opsets = [helper.make_opsetid("", OPSET)]
        # the oldest IR version that has the opset, not the onnx package's newest: runtimes
        # that lag behind the package (onnxruntime on a GPU machine) still load the model
        model = helper.make_model(graph, opset_imports=opsets, producer_name="tvm-stitch",
                                  ir_version=helper.find_min_ir_version_for(opsets))
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        onnx.checker.check_model(model, full_check=True)
        set_input_dists(model, self._dists)
        return model
