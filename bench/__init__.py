"""The benchmark harness behind `gen.py bench`: flashgen timed against its peers (cuDNN, FlashAttention, flex,
SDPA, ...). It lives in the repository, beside its results (bench/results/) and notes (bench/LOG.md), and is not
installed with codegen: run it from a checkout, as `python gen.py bench ...` or `python3 scripts/x.py` (the scripts
put the checkout's root on sys.path themselves).

Each job has its own module, and users import a name from the module that defines it: cases (the problems and
matrices), config (the command line; its USAGE is the --help text), inputs (the timed tensors), peers (the
implementations), gpu_run (timing on the GPU), report (rows, tables, result files, metadata), compile_timing
(`--compile`), decode and backward (the matrices with rows of their own), cli (bench_main), clocks (SM clock and power while a kernel runs) and targets (issue 4's speed
targets over result files)."""
