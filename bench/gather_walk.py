"""The served tree walk against an explicit SIMD one (AVX gathers), bit for bit and in µs per call.

Issue #15 asks whether the trees can be evaluated faster than the served numba walk
(``prediction_server.jit_kernels``), which visits a node in about 1 ns on the development machine:
two dependent loads per visit (the split, then the row's key for its feature), with many rows or
trees in flight so the CPU overlaps them. The only instructions that would do several visits at once
are gathers (one load per SIMD lane). numba does not emit them for the walk, so this script writes
them itself: an ``@intrinsic`` that walks the eight trees of a layout group (``jit_layout.GROUP``)
for eight rows at a time with LLVM's ``masked.gather`` (eight 64-bit lanes per gather, eight
independent walks interleaved so the gathers' latency overlaps), over the same tables
(``JitForests``' packed splits, leaves and groups) and the same keys (``jit_kernels._fill_keys``).
Leaves are added lane by lane in tree order onto ``base_score``, as XGBoost does, so the margins
are the served kernel's bits: every cell checks that before it is timed. A group of fewer than eight
trees and the rows beyond a multiple of eight go through the served kernel's own scalar walk. The
models are the ones ``bench/prediction_load.py`` serves (``publish_benchmark_model``), the timing is
``bench/tree_eval.py``'s (per-call medians, the two walks alternating within each run).

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python bench/gather_walk.py [--trees 200 --depth 6]

Measured results are in docs/benchmarks-prediction.md. Nothing here is served: the prediction
server uses ``jit_kernels``; this is the evidence for why.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.prediction_load import make_rows, publish_benchmark_model  # noqa: E402
from bench.tree_eval import _cycling, _timings_us  # noqa: E402
from prediction_server import jit_kernels  # noqa: E402
from prediction_server.jit_forest import JitForests  # noqa: E402
from prediction_server.jit_layout import BLOCK, GROUP  # noqa: E402
from shared.artifacts import MODEL_NAMES  # noqa: E402
from shared.features import build_features  # noqa: E402
from shared.model_store import ModelStore  # noqa: E402
from shared.schemas import parse_rows  # noqa: E402

LANES = 8  # rows per gather (eight 64-bit lanes: one AVX-512 register)
if GROUP != 8:
    raise ImportError("_group_walk walks layout groups of exactly 8 trees")
_I1, _I32, _I64, _F32 = ir.IntType(1), ir.IntType(32), ir.IntType(64), ir.FloatType()
_VI, _VF = ir.VectorType(_I64, LANES), ir.VectorType(_F32, LANES)
_VP = ir.VectorType(ir.PointerType(), LANES)
_ALL = ir.Constant(ir.VectorType(_I1, LANES), [1] * LANES)


def _splat(builder: ir.IRBuilder, value: ir.Value, vtype: ir.VectorType) -> ir.Value:
    one = builder.insert_element(ir.Constant(vtype, ir.Undefined), value, ir.Constant(_I32, 0))
    zeros = ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES)
    return builder.shuffle_vector(one, ir.Constant(vtype, ir.Undefined), zeros)


def _gather(builder: ir.IRBuilder, base: ir.Value, index: ir.Value, vtype: ir.VectorType) -> ir.Value:
    """``base[index[l]]`` for every lane ``l`` (elements of ``vtype``'s type: i64 or f32)."""
    wide = vtype.element == _I64
    offsets = builder.shl(index, ir.Constant(_VI, [3 if wide else 2] * LANES))
    pointers = builder.inttoptr(builder.add(_splat(builder, builder.ptrtoint(base, _I64), _VI), offsets), _VP)
    name = f"llvm.masked.gather.v{LANES}{'i64' if wide else 'f32'}.v{LANES}p0"
    function = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vtype, [_VP, _I32, _ALL.type, vtype]), name
    )
    alignment = ir.Constant(_I32, 8 if wide else 4)
    return builder.call(function, [pointers, alignment, _ALL, ir.Constant(vtype, ir.Undefined)])


@intrinsic
def _group_walk(typingctx: Any, packed, keys, row_keys, first_node, size, depth, leaves, first_leaf, acc):  # type: ignore[no-untyped-def]
    """``acc[l] +=`` the leaf of each of the group's ``GROUP`` trees for the row whose keys start at
    ``row_keys[l]``, in tree order (the trees' nodes from ``first_node``, ``size`` each; leaves from
    ``first_leaf``, ``size + 1`` each)."""
    signature = types.void(packed, keys, row_keys, first_node, size, depth, leaves, first_leaf, acc)
    trees = GROUP

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        arrays = {i: context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 1, 2, 6, 8)}
        first_node, size, depth, first_leaf = args[3], args[4], args[5], args[7]
        firsts = [
            _splat(builder, builder.add(first_node, builder.mul(size, ir.Constant(_I64, t))), _VI)
            for t in range(trees)
        ]
        row_base = builder.load(builder.bitcast(arrays[2].data, _VI.as_pointer()), align=8)
        nodes = [cgutils.alloca_once_value(builder, ir.Constant(_VI, [0] * LANES)) for _ in range(trees)]
        column_mask, one, high = (ir.Constant(_VI, [v] * LANES) for v in (0xFFFF, 1, 32))
        with cgutils.for_range(builder, depth):
            at = [builder.load(slot) for slot in nodes]
            nodes_now = [builder.add(f, q) for f, q in zip(firsts, at, strict=True)]
            splits = [_gather(builder, arrays[0].data, node, _VI) for node in nodes_now]
            columns = [builder.add(row_base, builder.and_(split, column_mask)) for split in splits]
            row_keys_now = [_gather(builder, arrays[1].data, column, _VI) for column in columns]
            for t in range(trees):
                right = builder.icmp_unsigned(">=", row_keys_now[t], builder.lshr(splits[t], high))
                step = builder.add(builder.add(at[t], at[t]), one)
                builder.store(builder.add(step, builder.zext(right, _VI)), nodes[t])
        acc_pointer = builder.bitcast(arrays[8].data, _VF.as_pointer())
        total = builder.load(acc_pointer, align=4)
        width = builder.add(size, ir.Constant(_I64, 1))
        for t in range(trees):
            leaf_base = builder.add(builder.sub(first_leaf, size), builder.mul(width, ir.Constant(_I64, t)))
            index = builder.add(_splat(builder, leaf_base, _VI), builder.load(nodes[t]))
            total = builder.fadd(total, _gather(builder, arrays[6].data, index, _VF))
        builder.store(total, acc_pointer, align=4)
        return context.get_dummy_value()

    return signature, codegen


@numba.njit(nogil=True, boundscheck=False, error_model="numpy")
def _walk_gathered(keys, stride, start, m, packed, leaves, groups, out):  # type: ignore[no-untyped-def]
    """``jit_kernels._walk_rows_together``'s contract: eight rows at a time by ``_group_walk``; a
    group of fewer than eight trees, and the rows beyond a multiple of eight, by the served kernel's
    own scalar walk (``jit_kernels._walk_trees_together``), each in its place so leaves add in tree
    order."""
    row_keys = np.empty(LANES, np.int64)
    acc = np.empty(LANES, np.float32)
    done = 0
    while done + LANES <= m:
        for lane in range(LANES):
            row_keys[lane] = (done + lane) * stride
        for g in range(groups.shape[0]):
            if groups[g, 4] != GROUP:
                block_keys = keys[done * stride :]
                jit_kernels._walk_trees_together(
                    block_keys, stride, start + done, LANES, packed, leaves, groups[g : g + 1], out
                )
                continue
            depth, first_node, first_leaf, k = groups[g, 0], groups[g, 1], groups[g, 2], groups[g, 3]
            size = (np.int64(1) << depth) - 1
            for lane in range(LANES):
                acc[lane] = out[k, start + done + lane]
            _group_walk(packed, keys, row_keys, first_node, size, depth, leaves, first_leaf, acc)
            for lane in range(LANES):
                out[k, start + done + lane] = acc[lane]
        done += LANES
    if done < m:
        rest = keys[done * stride :]
        jit_kernels._walk_trees_together(rest, stride, start + done, m - done, packed, leaves, groups, out)


@numba.njit(boundscheck=False, error_model="numpy")
def _margins_gathered(X, packed, leaves, groups, base, out):  # type: ignore[no-untyped-def]
    """``jit_kernels.tree_margins`` with ``_walk_gathered`` for blocks of eight rows or more."""
    n, nf = X.shape
    for k in range(base.shape[0]):
        for i in range(n):
            out[k, i] = base[k]
    stride = 2 * nf
    block = BLOCK
    keys = np.empty(block * stride, np.uint64)
    for start in range(0, n, block):
        m = min(n, start + block) - start
        jit_kernels._fill_keys(X, start, m, keys)
        if m >= LANES:
            _walk_gathered(keys, stride, start, m, packed, leaves, groups, out)
        else:
            jit_kernels._walk_trees_together(keys, stride, start, m, packed, leaves, groups, out)


def _forests(trees: int, depth: int) -> JitForests:
    """Both models of the version ``bench/prediction_load.py`` serves at this size, laid out."""
    import xgboost as xgb

    with tempfile.TemporaryDirectory() as tmp:
        store = ModelStore(Path(tmp))
        model_set = store.load(publish_benchmark_model(store, trees, depth))
    boosters = []
    for name in MODEL_NAMES:
        booster = xgb.Booster()
        booster.load_model(bytearray(model_set.files[name]))
        boosters.append(booster)
    return JitForests.from_boosters(boosters)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", type=int, default=200)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--rows", default="8,10,32,100,1000")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--run-seconds", type=float, default=0.2, help="time budget per method per run")
    args = parser.parse_args()
    forests = _forests(args.trees, args.depth)
    tables = (forests._packed, forests._leaves, forests._groups, forests._base)
    pool = build_features(parse_rows(make_rows(5_000, 3)))
    pool[::7, 3] = np.nan  # missing values take the default side
    print(
        f"both models, {args.trees}x{args.depth} each (bench/prediction_load.py's), fresh rows per call; "
        f"µs per call, median of {args.runs} runs of per-call medians (bench/tree_eval.py's timing)"
    )
    print("| rows | served walk | gathered walk | gathered / served |")
    print("|---|---|---|---|")
    for n in (int(v) for v in args.rows.split(",")):
        inputs = [np.ascontiguousarray(pool[i : i + n]) for i in range(0, len(pool) - n, max(n, 97))][:32]
        served, gathered = np.empty((2, n), np.float32), np.empty((2, n), np.float32)
        for X in inputs:
            jit_kernels.tree_margins(X, *tables, served)
            _margins_gathered(X, *tables, gathered)
            if not np.array_equal(served.view(np.uint32), gathered.view(np.uint32)):
                raise SystemExit(f"{n} rows: the gathered walk's margins differ from the served walk's")
        methods = {
            "served": _cycling(lambda X: jit_kernels.tree_margins(X, *tables, served), inputs),  # noqa: B023
            "gathered": _cycling(lambda X: _margins_gathered(X, *tables, gathered), inputs),  # noqa: B023
        }
        us = _timings_us(methods, args.runs, args.run_seconds)
        print(f"| {n} | {us['served']:,.1f} | {us['gathered']:,.1f} | {us['gathered'] / us['served']:.2f} |")


if __name__ == "__main__":
    main()
