"""cpfold call 1's what-if cells: benchmarks/micro.py run in process with one skinny_gemm constant replaced
(the code each cell names, exactly; nothing else differs). Usage: python3 whatif.py CELL MICRO-ARGS...

    moe_parts   MAX_FOLDED_PARTS = 16: the talker's input norms (the MoE's 8 bf16 parts) folded as well
    wide_tiles  the folded one-row GEMVs of the code predictor (qkv, gate/up, heads) at Blocks(16, 1024, 1, 8, 1):
                half the programs, each recomputing the row's statistics, 128 weights a thread as now
"""

import runpy
import sys

from omniwalk.layers import skinny_gemm as sg

cell = sys.argv.pop(1)
if cell == "moe_parts":
    sg.MAX_FOLDED_PARTS = 16
elif cell == "wide_tiles":
    for key in [(1, 4096, 1024, False, False), (1, 3072, 1024, True, False), (1, 2048, 1024, False, False)]:
        sg.TUNED[key] = sg.Blocks(16, 1024, 1, 8, 1)
else:
    raise SystemExit(f"unknown cell {cell}")
print(f"what-if {cell}: MAX_FOLDED_PARTS={sg.MAX_FOLDED_PARTS}, cp qkv {sg.pick_blocks(1, 4096, 1024, False, False)}")
sys.argv[0] = "benchmarks/micro.py"
sys.path.insert(0, "benchmarks")  # (micro.py imports its siblings)
runpy.run_path("benchmarks/micro.py", run_name="__main__")
