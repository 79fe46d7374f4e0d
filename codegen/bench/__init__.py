"""`gen.py bench`, flashgen timed against its peers, as a package. Each job has its own module: cases (the
problems and matrices), config (the command line; its USAGE is the --help text), inputs (the timed tensors), peers
(the implementations), gpu_run (timing on the GPU), report (rows, tables, result files, metadata), compile_timing
(`--compile`) and cli (bench_main). The names the old single module had are re-exported here."""

from __future__ import annotations

from .cases import (MATRICES, VARLEN_16K, VARLEN_4K, VARLEN_SEED, VARLEN_USAGE, BenchUsageError, Case, block_n_for,
    case_from, kernel_spec, kv_heads_problem, parse_shape, parse_varlen, ragged_lengths, varlen_case)
from .cli import bench_main
from .compile_timing import (COLD_TARGET_S, WARM_TARGET_S, BuildTiming, CompileTiming, compile_markdown, compile_specs,
    compile_table, fresh_cache_dir, import_seconds, run_compile, save_compile, time_compile)
from .config import ALL_PEERS, MATRIX_PEERS, VARLEN_ONLY_PEERS, VARLEN_PEERS, BenchConfig, build_parser, parse_config
from .gpu_run import (ROUND_WARMUP, ROUNDS, TIME_BUDGET_MS, bench_case, cuda_fault, iterations_within, measure,
    measure_together, run_gpu, snr_db_from)
from .inputs import (MAX_INPUT_SETS, ROTATE_BELOW_BYTES, Inputs, cu_seqlens_of, input_set_count, key_padding_bias,
    make_inputs, make_varlen_inputs, pad_packed, padded_rows, unpad, varlen_reference)
from .peers import (CANDIDATE_SPLITS, MATH_MAX_SCORES, PEERS, UNFUSED_MAX_SCORES, VARLEN_PEER_IMPLS, Peer, Unavailable,
    _flash_varlen_calls, _flashgen_varlen_calls, _flex_calls, _flex_varlen_calls, _ragged_kwargs, _sdpa_calls,
    _unfused_calls, _unpadded, aten_op, gqa_kwargs, peer_names, peers_for, sdpa_kwargs, splits_for)
from .report import (DEFAULT_OUT, ROOT, RUN_KEYS, TABLE_HEADER, BenchResult, RatioSummary, Row, case_table,
    display_name, finalize, geomean, git_commit, gpu_meta, host_meta, nvidia_smi_driver, ratio_summaries,
    render_markdown, render_text, results_markdown, row_cells, save_results, slug, source_sha256, split_impl,
    split_name, summary_table, utc_stamp, varlen_note)

__all__ = [
    "MATRICES", "VARLEN_16K", "VARLEN_4K", "VARLEN_SEED", "VARLEN_USAGE", "BenchUsageError", "Case", "block_n_for",
    "case_from", "kernel_spec", "kv_heads_problem", "parse_shape", "parse_varlen", "ragged_lengths", "varlen_case",
    "ALL_PEERS", "MATRIX_PEERS", "VARLEN_ONLY_PEERS", "VARLEN_PEERS", "BenchConfig", "build_parser", "parse_config",
    "MAX_INPUT_SETS", "ROTATE_BELOW_BYTES", "Inputs", "cu_seqlens_of", "input_set_count", "key_padding_bias",
    "make_inputs", "make_varlen_inputs", "pad_packed", "padded_rows", "unpad", "varlen_reference", "CANDIDATE_SPLITS",
    "MATH_MAX_SCORES", "PEERS", "UNFUSED_MAX_SCORES", "VARLEN_PEER_IMPLS", "Peer", "Unavailable",
    "_flash_varlen_calls", "_flashgen_varlen_calls", "_flex_calls", "_flex_varlen_calls", "_ragged_kwargs",
    "_sdpa_calls", "_unfused_calls", "_unpadded", "aten_op", "gqa_kwargs", "peer_names", "peers_for", "sdpa_kwargs",
    "splits_for", "ROUNDS", "ROUND_WARMUP", "TIME_BUDGET_MS", "bench_case", "cuda_fault", "iterations_within",
    "measure", "measure_together", "run_gpu",
    "snr_db_from", "DEFAULT_OUT", "ROOT", "RUN_KEYS", "TABLE_HEADER", "BenchResult", "RatioSummary", "Row",
    "case_table", "display_name", "finalize", "geomean", "git_commit", "gpu_meta", "host_meta", "nvidia_smi_driver",
    "ratio_summaries", "render_markdown", "render_text", "results_markdown", "row_cells", "save_results", "slug",
    "source_sha256", "split_impl", "split_name", "summary_table", "utc_stamp", "varlen_note", "COLD_TARGET_S",
    "WARM_TARGET_S", "BuildTiming", "CompileTiming", "compile_markdown", "compile_specs", "compile_table",
    "fresh_cache_dir", "import_seconds", "run_compile", "save_compile", "time_compile", "bench_main",
]
