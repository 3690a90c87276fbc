"""The parts of ``benchmarks/multigpu_bench.py``: measurement records and their arithmetic
(:mod:`.records`), the tables (:mod:`.tables`), the goals (:mod:`.goals`), the plot (:mod:`.plot`)
and one rank's side of the run on the GPUs (:mod:`.bench`). All but ``bench`` need no GPU."""
