"""The generality run: every function of the seeded generator (:mod:`.generated`: the op
classes in the styles users write them) and hand-written user forms, all through
``tvm_dsm.build``'s path (a family, dlight, or one schedule per operator): FFNs with ``[K, N]``
weights, bf16, fp32 and sizes off the tiles, and dense layers at decode batch sizes (2-13 rows,
a 1B-class decoder's linear layers) and prime ones."""

from __future__ import annotations

import math

import tvm
from tvm import te

from ...driver import schedule
from .base import Variant, args_of, nbytes_of
from .generated import generated


def _matmul(x, w, name: str, nk: bool):
    """``x @ w^T`` (``nk``: w stored [N, K], torch.nn.Linear's) or ``x @ w`` (w [K, N]), fp32 sums."""
    m, k = x.shape
    n = w.shape[0] if nk else w.shape[1]
    r = te.reduce_axis((0, k), name=f"r_{name}")
    if nk:
        return te.compute((m, n), lambda i, j: te.sum(x[i, r].astype("float32") * w[j, r].astype("float32"), axis=r),
                          name=name)
    return te.compute((m, n), lambda i, j: te.sum(x[i, r].astype("float32") * w[r, j].astype("float32"), axis=r),
                      name=name)


def ffn(m: int, n: int, k: int, l: int, dtype: str, nk: bool):
    """``relu(A @ W1) @ W2`` with the intermediate rounded to ``dtype``."""
    a = te.placeholder((m, k), dtype, name="A")
    w1 = te.placeholder((n, k) if nk else (k, n), dtype, name="W1")
    w2 = te.placeholder((l, n) if nk else (n, l), dtype, name="W2")
    h = te.compute((m, n), lambda i, j: te.max(_matmul(a, w1, "C", nk)[i, j], 0.0).astype(dtype), name="H")
    e = _matmul(h, w2, "E", nk)
    out = te.compute((m, l), lambda i, j: e[i, j].astype(dtype), name="Out")
    return te.create_prim_func([a, w1, w2, out])


def dense(m: int, n: int, k: int, dtype: str):
    x = te.placeholder((m, k), dtype, name="X")
    w = te.placeholder((n, k), dtype, name="W")
    y = _matmul(x, w, "Y", True)
    out = te.compute((m, n), lambda i, j: y[i, j].astype(dtype), name="Out")
    return te.create_prim_func([x, w, out])


FFNS = [  # (m, n, k, l, dtype, weights [N, K])
    (128, 2048, 512, 512, "bfloat16", True), (128, 2048, 512, 512, "float16", False),
    (100, 3000, 1000, 1000, "float16", True), (128, 2048, 512, 512, "float32", True),
    (37, 1024, 512, 256, "bfloat16", False),
]
DENSES = [(1, 4096, 4096, "float16"), (7, 4096, 4096, "float16"), (100, 3000, 1000, "bfloat16"),
          (257, 2048, 1024, "float16"), (2, 3072, 2048, "float16"), (4, 2048, 8192, "float16"),
          (8, 16384, 2048, "bfloat16"), (13, 2048, 2048, "float16")]


def _variant(name: str, func, workload: str, scale: list, flops: int) -> Variant:
    args = args_of(func)
    for a, s in zip(args, scale):
        if s:
            a["scale"] = s
    return Variant(name=name, workload=workload, mod=schedule(func).mod, args=args, bytes=nbytes_of(args),
                   flops=flops, peers=("torch_eager",), extra={"class": workload})


def generality() -> list[Variant]:
    """The generated functions, then the user forms."""
    return generated() + user_forms()


def user_forms() -> list[Variant]:
    variants = []
    for m, n, k, l, dtype, nk in FFNS:
        layout = "nk" if nk else "kn"
        variants.append(_variant(f"ffn_{m}x{k}x{n}x{l}_{dtype}_{layout}", ffn(m, n, k, l, dtype, nk),
                                 f"ffn_relu_{layout}", [0, 1 / math.sqrt(k), 1 / math.sqrt(n)],
                                 2 * m * n * (k + l)))
    for m, n, k, dtype in DENSES:
        variants.append(_variant(f"dense_{m}x{n}x{k}_{dtype}", dense(m, n, k, dtype), "dense",
                                 [0, 1 / math.sqrt(k)], 2 * m * n * k))
    return variants


#: A 1B-class decoder's linear layers (N, K): fused QKV, gate and up, down, LM head.
ROW_LAYERS = [(3072, 2048), (16384, 2048), (2048, 8192), (32000, 2048)]
#: Row counts the symbolic-row dense layers are called with: decode batches, prefill chunks.
ROW_COUNTS = (1, 4, 8, 16, 17, 48, 64, 100, 256, 1000, 2048, 4096)


def symbolic_rows() -> list[Variant]:
    """Dense layers of a symbolic row count (``te.var("m")``), each built once per path and
    called at every row count of ROW_COUNTS: tvm-dsm's (``tvm_dsm.build``: a kernel per range
    of rows), TVM's as MLC-LLM schedules it (low-batch GEMV up to 8 rows, dlight's matmul
    beyond: :func:`tvm_dsm.relax_pipeline.low_batch_dispatch`) and dlight's alone; beside them
    tvm-dsm's build of each row count as a constant (``static``), the mark for the first."""
    from ...driver import stock_schedule
    from ...stock import stock_target
    from ...relax_pipeline import low_batch_dispatch

    variants = []
    for n, k in ROW_LAYERS:
        func = dense(te.var("m"), n, k, "float16")
        paths = {"tvm_dsm": schedule(func).mod, "dlight": stock_schedule(func).mod}
        with stock_target() as target:
            paths["low_batch"] = tvm.IRModule({"main": low_batch_dispatch(func, target)})
        for path, mod in [*paths.items(), ("static", None)]:
            for m in ROW_COUNTS:
                args = [{"name": "X", "shape": [m, k], "dtype": "float16", "output": False},
                        {"name": "W", "shape": [n, k], "dtype": "float16", "output": False,
                         "scale": 1 / math.sqrt(k)},
                        {"name": "Out", "shape": [m, n], "dtype": "float16", "output": True}]
                variants.append(Variant(
                    name=f"rows_{n}x{k}_m{m}_{path}", workload="dense",
                    mod=schedule(dense(m, n, k, "float16")).mod if mod is None else mod, args=args,
                    bytes=nbytes_of(args), flops=2 * m * n * k, peers=("torch_eager",),
                    extra={"class": "symbolic_rows", "path": path, "rows": m}))
    return variants
