"""Launch tvm-dsm's kernels with programmatic dependent launch (PDL, Hopper).

Back to back on a stream, a kernel normally starts only after the previous one has finished
and its CTAs have left: the launch, the CTAs' dispatch and their shared-memory setup all wait.
With ``cudaLaunchAttributeProgrammaticStreamSerialization`` (TVM 0.27's launch tag
``tirx.use_programtic_dependent_launch``) the next kernel launches as soon as every CTA of the
previous one has executed ``griddepcontrol.launch_dependents``, and its threads wait in
``griddepcontrol.wait`` until the previous grid has completed and its memory is visible.

A schedule asks for it with :func:`launch_programmatically` (an annotation of its root block,
so MetaSchedule traces record it); TVM's stock schedules built through the same pipeline are
left as they are. Every kernel of such a function starts with ``griddepcontrol.wait`` (before
any global load or store, so neither a read-after-write nor a write-after-read across kernels
can race) and then lets its dependents launch.

Measured on the H100 (bench/results/programmatic_launch.json): unfused chains gain (G4 18.0 ->
15.3 us, S8 26.4 -> 25.3); single GEMMs whose grid runs in one wave gain 0.3-1.4 us (G4a 7.5 ->
6.8, S3a 76.2 -> 74.8), but grids of several waves lose (G4b 7.8 -> 9.0, 4096^3 197 -> 229),
also with the trigger at the kernel's end (8.7, 212; the ``_pdl_late`` rows). So the unfused
chain asks for it, and a GEMM where its planner expects one wave
(:attr:`tvm_dsm.rules.split_k_gemm.SplitKGemmConfig.programmatic_launch`).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.script import tirx as T

from ..ir import find_all

#: Root-block annotation asking for it; s_tir lowering keeps ``pragma_`` annotations as
#: attributes around the function body.
PROGRAMMATIC_LAUNCH_KEY = "pragma_tvm_dsm_programmatic_launch"
#: TVM's launch-parameter tag for programmatic stream serialization (spelled as in TVM 0.27).
PDL_LAUNCH_TAG = "tirx.use_programtic_dependent_launch"
_LAUNCH_PARAMS_KEY = "tirx.kernel_launch_params"


def launch_programmatically(sch: s_tir.Schedule, enable: bool = True) -> None:
    """Have the kernels of ``sch``'s function launched programmatically (or not)."""
    root = sch.get_sblock("root")
    if enable:
        sch.annotate(root, PROGRAMMATIC_LAUNCH_KEY, 1)
    elif PROGRAMMATIC_LAUNCH_KEY in sch.get(root).annotations:
        sch.unannotate(root, PROGRAMMATIC_LAUNCH_KEY)


def _is_marker(stmt) -> bool:
    return isinstance(stmt, tirx.AttrStmt) and stmt.attr_key == PROGRAMMATIC_LAUNCH_KEY


def _is_kernel_launch(stmt) -> bool:
    return (isinstance(stmt, tirx.AttrStmt) and stmt.attr_key == "thread_extent"
            and stmt.node.thread_tag.startswith("blockIdx"))


def programmatic_launch(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Each kernel of ``func`` (its outermost ``blockIdx`` launches) waits for the previous
    grid, then lets the next one launch; ``func`` requests the launch attribute."""
    if not find_all(func.body, tirx.AttrStmt, _is_marker):
        return func
    prologue = [tirx.Evaluate(T.ptx.griddepcontrol.wait()),
                tirx.Evaluate(T.ptx.griddepcontrol.launch_dependents())]

    launches = find_all(func.body, tirx.AttrStmt, _is_kernel_launch)
    inner = [n for launch in launches for n in find_all(launch.body, tirx.AttrStmt, _is_kernel_launch)]
    kernels = [launch for launch in launches if not any(launch.same_as(n) for n in inner)]

    def with_prologue(stmt):
        if not any(stmt.same_as(k) for k in kernels):
            return stmt
        return tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value,
                             tirx.SeqStmt([*prologue, stmt.body]))

    def on_attr(stmt):  # a marker's body may be the kernel itself (one fused-rows kernel)
        return with_prologue(stmt.body if _is_marker(stmt) else stmt)

    body = tvm_ffi.structural_map(func.body, [(tirx.AttrStmt, on_attr)], order="pre")
    params = list(func.attrs.get(_LAUNCH_PARAMS_KEY, [])) if func.attrs is not None else []
    return func.with_body(body).with_attr(_LAUNCH_PARAMS_KEY, [*params, PDL_LAUNCH_TAG])


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.ProgrammaticLaunch")
def ProgrammaticLaunch(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """:func:`programmatic_launch` on every PrimFunc of ``mod``."""
    return tvm.IRModule({gv: programmatic_launch(f) if isinstance(f, tirx.PrimFunc) else f
                         for gv, f in mod.functions.items()}, attrs=mod.attrs)
