"""Graph input names that TVM's importer would carry into CUDA source as invalid identifiers.

TVM 0.27's ONNX importer sanitises a graph input's name only by replacing ``.`` (and
prefixing ``input_`` to one that does not start with a letter or ``_``); every other
character stays in the Relax parameter's name and from there in the kernels' parameter
names, so an input named like a torch export's internal value (``/model/encoder/Add_output_0``,
a constant that became an input) gives CUDA source nvcc rejects, in TVM's fusion and ours
alike. ``identifier_inputs`` renames such inputs before importing.
"""

from __future__ import annotations

import re

import onnx

_NOT_IDENTIFIER = re.compile(r"\W")


def identifier_inputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, str]]:
    """``model`` with every graph input whose name has a character other than letters,
    digits and ``_`` renamed (each such character becomes ``_``, made unique), in every
    place the name is used; and the renames (old name -> new). ``model`` itself when no input
    needs it."""
    graph = model.graph
    taken = {v.name for v in [*graph.input, *graph.output, *graph.value_info]}
    taken |= {i.name for i in graph.initializer} | {o for n in graph.node for o in n.output}
    renames: dict[str, str] = {}
    for value in graph.input:
        if not _NOT_IDENTIFIER.search(value.name):
            continue
        base = _NOT_IDENTIFIER.sub("_", value.name)
        new, count = base, 0
        while new in taken:
            count += 1
            new = f"{base}_{count}"
        taken.add(new)
        renames[value.name] = new
    if not renames:
        return model, renames
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _rename(out.graph, renames)
    return out, renames


def _rename(graph: onnx.GraphProto, renames: dict[str, str]) -> None:
    """Rename every use of ``renames``' names in ``graph`` and its subgraphs (a subgraph's
    own value of the same name shadows it from there on: left alone)."""
    for value in [*graph.input, *graph.output, *graph.value_info]:
        value.name = renames.get(value.name, value.name)
    for init in graph.initializer:
        init.name = renames.get(init.name, init.name)
    for node in graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
        for attr in node.attribute:
            inner = {name: new for name, new in renames.items()
                     if not _defines(attr.g, name)} if attr.HasField("g") else {}
            if inner:
                _rename(attr.g, inner)
            for sub in attr.graphs:
                _rename(sub, {n: v for n, v in renames.items() if not _defines(sub, n)})


def _defines(graph: onnx.GraphProto, name: str) -> bool:
    return (any(v.name == name for v in graph.input)
            or any(i.name == name for i in graph.initializer)
            or any(name in n.output for n in graph.node))
