#!/bin/sh
# This cell's ranks again, by hand: sh reproduce.sh [OUT_DIR] (default: reproduced/ beside this file;
# never a cell's own directory, whose result.json and metrics.jsonl are the sweep's figures)
cell=<TMP>/sweep/cells/00-strategy_ddp
out="${1:-$cell/reproduced}"
if [ -e "$out/spec.json" ] || { [ -d "$out" ] && [ "$(cd "$out" && pwd -P)" = "$(cd "$cell" && pwd -P)" ]; }; then
    echo "error: reproduce.sh: $out is a cell's own directory: its result.json and metrics.jsonl are the sweep's figures, never written over. Fix: sh reproduce.sh (writes to $cell/reproduced), or give a directory of its own. Nothing was run." >&2
    exit 2
fi
exec <PYTHON> -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node 2 -m jobs "$cell/spec.json" --out "$out"
