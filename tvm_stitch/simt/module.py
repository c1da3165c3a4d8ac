"""Run a whole scheduled Relax module on the CPU: kernels on the SIMT runner, the rest on LLVM.

Every ``call_tir`` of ``main`` is replaced by a ``call_dps_packed`` to a Python function that
runs that PrimFunc through :class:`SimtFunction`; what is left of ``main`` (allocation,
reshapes and views, tuples) is built for LLVM by TVM and driven by TVM's own Relax VM, so the
glue between kernels is TVM's, not ours.
"""

from __future__ import annotations

import itertools

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.ir import IRModule

from .kernel import SimtFunction

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
_ids = itertools.count()


@relax.expr_functor.mutator
class _CallTIRToSimt(relax.PyExprMutator):
    """Rewrites ``call_tir(gv, args)`` into ``call_dps_packed("simt.<id>.<gv>", args)``."""

    def __init__(self, mod: IRModule, packed_names: dict[str, str]) -> None:
        super().__init__(mod)
        self.packed_names = packed_names
        self.num_outputs: dict[str, int] = {}

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(_CALL_TIR)):
            return call
        gv = call.args[0]
        if len(call.args) > 2:
            raise NotImplementedError(
                f"call_tir of {gv.name_hint} passes symbolic shape arguments (tir_vars), "
                "which the SIMT runner does not forward"
            )
        (out_ty,) = call.ty_args
        out_tys = list(out_ty.fields) if isinstance(out_ty, tvm.ir.TupleType) else [out_ty]
        self.num_outputs[gv.name_hint] = len(out_tys)
        return relax.call_dps_packed(self.packed_names[gv.name_hint], call.args[1],
                                     out_tys if len(out_tys) > 1 else out_tys[0])


class SimtModule:
    """A scheduled IRModule (Relax ``main`` calling GPU-scheduled PrimFuncs) made runnable on
    the CPU. Call it with numpy arrays for ``main``'s parameters; it returns numpy arrays.
    """

    def __init__(self, scheduled: IRModule, entry: str = "main") -> None:
        token = f"simt.{next(_ids)}"
        self.functions: dict[str, SimtFunction] = {}
        packed_names = {
            gv.name_hint: f"{token}.{gv.name_hint}"
            for gv, func in scheduled.functions.items()
            if isinstance(func, tirx.PrimFunc)
        }
        rewriter = _CallTIRToSimt(scheduled, packed_names)
        main = rewriter.visit_expr(scheduled[entry])
        for name, num_outputs in rewriter.num_outputs.items():
            self.functions[name] = SimtFunction.from_primfunc(scheduled[name], name)
            tvm.register_global_func(packed_names[name], self._packed(name, num_outputs),
                                     override=True)
        host = IRModule({entry: main}, attrs=scheduled.attrs)
        self._exec = tvm.compile(host, tvm.target.Target("llvm"))
        self._vm = relax.VirtualMachine(self._exec, tvm.cpu())
        self._entry = entry

    def _packed(self, name: str, num_outputs: int):
        func = self.functions[name]
        scalar_names = [p.name for p in func.lowered.params
                        if not isinstance(p.ty, tirx.BufferType)]

        def run(*args: tvm.runtime.Tensor | int) -> None:
            # a call passes the PrimFunc's scalar parameters (shape values) among its tensors
            tensors = [a for a in args if isinstance(a, tvm.runtime.Tensor)]
            scalars = dict(zip(scalar_names, (int(a) for a in args
                                              if not isinstance(a, tvm.runtime.Tensor)),
                               strict=True))
            arrays = [t.numpy() for t in tensors]
            func(*arrays, **scalars)
            for t, a in zip(tensors[-num_outputs:], arrays[-num_outputs:], strict=True):
                t.copyfrom(a)

        return run

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        result = self._vm[self._entry](*[tvm.runtime.tensor(a) for a in inputs])
        return _flatten(result)


def _flatten(value: object) -> list[np.ndarray]:
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    return [a for v in value for a in _flatten(v)]
