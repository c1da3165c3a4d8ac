"""Give a persistent (Global-stitched) kernel's Relax calls the buffers only it uses.

A kernel with grid barriers takes one more input, the barrier state: two 32-bit words that
must be zero when the first launch starts and that every completed barrier leaves at a zero
count again (``tvm_stitch.schedule.grid_barrier``). A zero-initialised Relax constant is such
a buffer: allocated once with the module's other constants, in device memory, and never
reset by the host. It is one constant per kernel, so two kernels never share a state; kernels
of one stream run one after another, so launches of one kernel do not overlap either.

Its workspaces (the partial sums of column reductions, which separate kernels would have
exchanged through host-allocated workspaces) become extra outputs of the call: Relax
allocates them with the call's results, and nothing reads them after the call.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.ir import IRModule

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _tensor_type(buffer: tirx.Buffer) -> relax.TensorType:
    return relax.TensorType([int(d) for d in buffer.shape], str(buffer.dtype))


@relax.expr_functor.mutator
class _ExtendCalls(relax.PyExprMutator):
    """Adds the state argument and the workspace outputs to every call of one kernel."""

    def __init__(self, mod: IRModule, old: tvm.ir.GlobalVar, new: tvm.ir.GlobalVar,
                 state: tirx.Buffer | None, workspaces: tuple[tirx.Buffer, ...]) -> None:
        super().__init__(mod)
        self.old = old
        self.new = new
        self.state = state
        self.workspaces = workspaces

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        """Rebind a call of the kernel: the extended call, then its original results."""
        call = binding.value
        if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
                and call.op.same_as(_CALL_TIR) and call.args[0].same_as(self.old)):
            super().visit_var_binding_(binding)
            return
        args = list(call.args[1].fields) if isinstance(call.args[1], relax.Tuple) \
            else [call.args[1]]
        args = [self.visit_expr(a) for a in args]
        if self.state is not None:
            shape = [int(d) for d in self.state.shape]
            args.append(relax.const(np.zeros(shape, str(self.state.dtype))))
        (out_ty,) = call.ty_args
        outs = list(out_ty.fields) if isinstance(out_ty, tvm.ir.TupleType) else [out_ty]
        everything = tvm.ir.TupleType(outs + [_tensor_type(w) for w in self.workspaces])
        # the shape values a kernel of symbolic shape takes as scalars (``tir_vars``) stay
        extended = relax.Call(call.op, [self.new, relax.Tuple(args), *call.args[2:]],
                              call.attrs, [everything])
        packed = self.builder_.emit(extended, name_hint=f"{binding.var.name}_all")
        if isinstance(out_ty, tvm.ir.TupleType):
            value = relax.Tuple([relax.TupleGetItem(packed, i) for i in range(len(outs))])
        else:
            value = relax.TupleGetItem(packed, 0)
        if isinstance(binding.var, relax.DataflowVar):
            new = self.builder_.emit(value, name_hint=binding.var.name)
        else:
            new = self.builder_.emit_output(value, name_hint=binding.var.name)
        self.set_var_remap(binding.var, new)


def _signature(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` as its callers see it, to type its new GlobalVar: shape values are 64-bit in
    Relax, and a kernel that narrowed its indices takes them as 32-bit scalars (TVM converts
    them at the call; the Relax call is checked against the signature)."""
    params = [tvm.ir.Var(p.name, "int64") if not isinstance(p.ty, tirx.BufferType)
              and str(p.ty.dtype) == "int32" else p for p in func.params]
    return tirx.PrimFunc(params, func.body, func.ret_type, func.attrs)


def extend_calls(mod: IRModule, name: str, state: tirx.Buffer | None,
                 workspaces: tuple[tirx.Buffer, ...], func_name: str = "main") -> IRModule:
    """``mod`` whose ``func_name`` calls PrimFunc ``name`` (already given its new signature)
    with a zero ``state`` argument appended to its inputs and ``workspaces`` to its outputs.

    The PrimFunc gets a new GlobalVar: a GlobalVar keeps the type of the function it was
    first bound to, and Relax checks calls against it.
    """
    if state is None and not workspaces:
        return mod
    old = mod.get_global_var(name)
    new = relax.BlockBuilder().add_func(_signature(mod[old]), name)
    functions = {(new if gv.same_as(old) else gv): f for gv, f in mod.functions_items()}
    rebuilt = IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
    mutator = _ExtendCalls(rebuilt, old, new, state, workspaces)
    func = mutator.visit_expr(rebuilt[func_name])
    result = mutator.builder_.get()
    result[func_name] = func
    return result


__all__ = ["extend_calls"]
