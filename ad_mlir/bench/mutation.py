"""Mutation testing, as a benchmark (not a CI step): how many small breaks of the compiler
(`passes/`, `codegen/`, `runtime/`), its front door (`frontends/`), the generation runtime and
engine (`llm/`) and the server (`serve/`) the tests catch.

    python -m ad_mlir.bench.mutation --sample 120 --seed 39      # about an hour on 2 CPU cores
    python -m ad_mlir.bench.mutation --list --sample 10          # the sample only, nothing run
    python -m ad_mlir.bench.mutation --rerun                     # the survivors again, after new tests
    python -m ad_mlir.bench.mutation --report                    # results.md again from the JSON

Mutations are cosmic-ray's operators (operators replaced, comparisons flipped, numbers moved by
one, `break`/`continue` swapped, loops that run zero times, decorators removed, exceptions that
no longer catch, ...). Every place in the mutated files where an operator applies is a site;
the sample is a seeded random draw of sites, one mutation per site, drawn at random among those
that apply there (a sample of mutations would be mostly `a + b` replaced by each of a dozen other
operators). Sites inside type annotations are left out: with `from __future__ import annotations`
they are strings that nothing evaluates. The draw is proportional to sites per folder (largest
remainders), so each folder's share of the sample is its share of the sites, not the luck of the
seed.

The mutated files and their tests are the repository as committed (`--commit`, default HEAD),
exported into a scratch directory once per run (`git archive`): the working tree is never changed
and others' uncommitted edits are not part of the run. PYTHONPATH points the tests there. Each
mutant runs against only the tests mapped to its file in `TESTS` (FileCheck files through lit,
then pytest with `-x`), so one mutant takes seconds (a pass's FileCheck files) to a minute (a
server's tests), not the whole suite. A mutant is killed when those tests fail or run past `--timeout-factor` times the file's
unmutated run, which must pass first; it survives when they pass. The score is killed / run.

Results go to `--out` (benchmarks/results/mutation/): results.json (machine, tool and version,
seed, every mutant with its diff, outcome and time) and results.md (score and a table of every
survivor). Survivors are explained in notes.json beside them (mutant id -> the test that now
kills it, or why the mutant is equivalent); `--rerun` runs the survivors again and records the
outcome beside the first one, against the tests of `--commit` but each survivor's file as it was
in the first run's commit (a mutation is an occurrence of an operator in that text).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import difflib
import json
import os
import platform
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks" / "results" / "mutation"


@dataclass(frozen=True)
class Tests:
    """The tests that cover one source file: FileCheck files (run by lit) and pytest targets."""

    lit: tuple[str, ...] = ()
    pytest: tuple[str, ...] = ()


def _lit(*names: str) -> tuple[str, ...]:
    return tuple(n if "/" in n else f"tests/filecheck/transforms/{n}.mlir" for n in names)


_TRITON = "tests/filecheck/codegen/triton.mlir"
_CACHED = ("insert-cached-attention", "insert-cached-attention-errors", "insert-cached-attention-mla",
           "insert-cached-attention-paged", "insert-cached-attention-paged-errors", "insert-cached-attention-compressed",
           "insert-cached-attention-fp8")
_REGIONS = ("tests/unit/test_compile_random.py", "-k", "not random_ and not norm_and_softmax and not each_case")
_NUMERIC = ("tests/unit/test_codegen_numeric.py", "tests/unit/test_kernel_ops.py")
_FRONT_DOOR = ("tests/unit/test_front_door.py", "tests/unit/test_bad_input.py", "-k",
               "not inductor and not two_processes")  # both compile a graph twice: a minute each
_PAGED_ENGINE = "tests/models/test_paged_engine.py::test_"
_SERVE_TP = "tests/models/test_serve_tp.py::"
_NEAR_MISSES = "tests/unit/test_pattern_near_misses.py"

TESTS: dict[str, Tests] = {
    # passes: their FileCheck files first (a second each), then the pytest files that run them
    "ad_mlir/passes/__init__.py": Tests(_lit("fuse-silu-mul"), ("tests/unit/test_pipeline_config.py",)),
    "ad_mlir/passes/canonicalize.py": Tests(_lit("tests/filecheck/dialects/ad/canonicalize.mlir"),
                                            ("tests/unit/test_canonicalize.py", "-k", "cast or llama")),
    "ad_mlir/passes/decompose.py": Tests(_lit("decompose"), ("tests/unit/test_llm_ops.py", "-k", "decomposition")),
    "ad_mlir/passes/default.py": Tests((), ("tests/unit/test_pipeline_config.py", "tests/unit/test_kernel_ops.py")),
    "ad_mlir/passes/fuse_activation.py": Tests(_lit("fuse-activation"), ("tests/unit/test_pass_logs.py",
                                                                         "tests/unit/test_llm_ops.py", "-k", "activation")),
    "ad_mlir/passes/fuse_add_layernorm.py": Tests(_lit("fuse-add-layernorm"),
                                                  ("tests/unit/test_layer_norm.py", "-k", "not sm90")),
    "ad_mlir/passes/fuse_add_rmsnorm.py": Tests(_lit("fuse-add-rmsnorm"), ("tests/unit/test_verify.py", "-k", "wrong_rewrite")),
    "ad_mlir/passes/fuse_elementwise.py": Tests(_lit("fuse-elementwise", _TRITON), _REGIONS),
    "ad_mlir/passes/fuse_gelu_mul.py": Tests(_lit("fuse-gelu-mul")),
    "ad_mlir/passes/fuse_gemms.py": Tests(_lit("fuse-gemms"), ("tests/unit/test_pipeline_config.py",)),
    "ad_mlir/passes/fuse_rmsnorm_quant.py": Tests(_lit("fuse-rmsnorm-quant"), ("tests/unit/test_fp8.py",)),
    "ad_mlir/passes/fuse_rope_attention.py": Tests(_lit("fuse-rope-attention"), ("tests/unit/test_llm_ops.py",
                                                                               "tests/unit/test_pass_logs.py", "-k", "rope")),
    "ad_mlir/passes/fuse_silu_mul.py": Tests(_lit("fuse-silu-mul")),
    "ad_mlir/passes/capture_hidden_states.py": Tests(_lit("capture-hidden-states"), ("tests/models/test_eagle3.py",)),
    "ad_mlir/passes/insert_cached_attention.py": Tests(_lit(*_CACHED, "insert-cached-attention-logits"),
                                                       ("tests/unit/test_verify.py", "-k", "cached")),
    "ad_mlir/passes/cache/__init__.py": Tests(_lit("insert-cached-attention")),
    "ad_mlir/passes/cache/interface.py": Tests(_lit(*_CACHED)),
    "ad_mlir/passes/cache/table.py": Tests(_lit(*_CACHED, "insert-cached-attention-selective-scan",
                                                "insert-cached-attention-rg-lru",
                                                "insert-cached-attention-wkv")),
    "ad_mlir/passes/cache/attention.py": Tests(_lit(*_CACHED), ("tests/unit/test_verify.py", "-k", "cached")),
    "ad_mlir/passes/cache/attention_forms.py": Tests(_lit("insert-cached-attention", "insert-cached-attention-errors"),
                                                     ("tests/models/test_attention_forms.py", "-k",
                                                      "caches_its_attention or is_cached_with")),
    "ad_mlir/passes/cache/masks.py": Tests(_lit("insert-cached-attention", "insert-cached-attention-errors",
                                                "insert-cached-attention-mla")),
    "ad_mlir/passes/cache/compressed_attention.py": Tests(_lit("insert-cached-attention-compressed"),
                                                          ("tests/models/test_compressed_attention.py", "-k", "greedy")),
    "ad_mlir/passes/cache/sparse_attention.py": Tests(_lit("insert-cached-attention-dsa",
                                                           "insert-cached-attention-compressed")),
    "ad_mlir/passes/cache/mla.py": Tests(_lit("insert-cached-attention-mla", "insert-cached-attention-paged-mla",
                                              "insert-cached-attention-dsa"), ("tests/models/test_mla.py", "-k",
                                                                               "only_the_latent")),
    "ad_mlir/passes/cache/causal_conv.py": Tests(_lit("insert-cached-attention", "insert-cached-attention-paged")),
    "ad_mlir/passes/cache/ssm_scan.py": Tests(_lit("insert-cached-attention", "insert-cached-attention-paged-errors")),
    "ad_mlir/passes/cache/selective_scan.py": Tests(_lit("insert-cached-attention-selective-scan")),
    "ad_mlir/passes/cache/rg_lru.py": Tests(_lit("insert-cached-attention-rg-lru"),
                                            ("tests/models/test_rg_lru.py", "-k", "cached_per_slot")),
    "ad_mlir/passes/cache/wkv.py": Tests(_lit("insert-cached-attention-wkv"),
                                         ("tests/models/test_rwkv.py", "-k", "cached_per_slot")),
    "ad_mlir/passes/cache/gated_delta_rule.py": Tests(_lit("insert-cached-attention", "insert-cached-attention-paged")),
    "ad_mlir/passes/cache/token_window.py": Tests(_lit("insert-cached-attention", "insert-cached-attention-errors",
                                                       "insert-cached-attention-compressed",
                                                       "insert-cached-attention-paged-errors")),
    "ad_mlir/passes/cache/positions.py": Tests(_lit("insert-cached-attention", "insert-cached-attention-errors",
                                                    "insert-cached-attention-paged"),
                                               ("tests/models/test_counted_positions.py", "-k", "not interpreter")),
    "ad_mlir/passes/cache/logits.py": Tests(_lit("insert-cached-attention-logits", "insert-cached-attention-paged",
                                                 "insert-cached-attention-paged-mla")),
    "ad_mlir/passes/match_layernorm.py": Tests(_lit("match-layernorm"),
                                               ("tests/unit/test_layer_norm.py", "-k", "spell or two_dims")),
    "ad_mlir/passes/match_moe.py": Tests(_lit("match-moe"), ("tests/unit/test_match_moe.py",)),
    "ad_mlir/passes/match_rmsnorm.py": Tests(_lit("match-rmsnorm")),
    "ad_mlir/passes/optimize_rope.py": Tests(_lit("optimize-rope"), ("tests/unit/test_pipeline_config.py", "-k", "frozen")),
    "ad_mlir/passes/pipeline.py": Tests((), ("tests/unit/test_pipeline_config.py", "tests/unit/test_verify.py", "-k",
                                             "pipeline or skip or failing or yaml")),
    "ad_mlir/passes/position_mixing.py": Tests(_lit(*_CACHED)),
    "ad_mlir/passes/quantize_linear_fp8.py": Tests(_lit("quantize-linear-fp8"), ("tests/unit/test_fp8.py",)),
    "ad_mlir/passes/repeated_layers.py": Tests((), ("tests/models/test_repeated_layers.py", "-k",
                                                                "llama or renamed or another_groups")),
    "ad_mlir/passes/shard.py": Tests(_lit("shard", "shard-errors", "shard-moe", "shard-quantized"),
                                     ("tests/unit/test_shard.py", "tests/unit/test_shard_quantized.py", "-k", "not gloo")),
    "ad_mlir/passes/verify.py": Tests((), ("tests/unit/test_verify.py", "-k", "not every_family")),
    "ad_mlir/passes/patterns/__init__.py": Tests(_lit("fuse-silu-mul")),
    "ad_mlir/passes/patterns/activations.py": Tests(_lit("fuse-activation", "fuse-gelu-mul", "fuse-silu-mul")),
    "ad_mlir/passes/patterns/add_norm.py": Tests(_lit("fuse-add-rmsnorm", "fuse-add-layernorm", "fuse-rmsnorm-quant")),
    "ad_mlir/passes/patterns/attention_masks.py": Tests(_lit("fuse-rope-attention", *_CACHED),
                                                        ("tests/unit/test_attention_masks.py",)),
    "ad_mlir/passes/patterns/attention_patterns.py": Tests(_lit("fuse-rope-attention", *_CACHED)),
    "ad_mlir/passes/patterns/conv_patterns.py": Tests(_lit(*_CACHED)),
    "ad_mlir/passes/patterns/scan_patterns.py": Tests(_lit(*_CACHED)),
    "ad_mlir/passes/patterns/mla_patterns.py": Tests(_lit("insert-cached-attention-mla"), (_NEAR_MISSES, "-k", "mla")),
    "ad_mlir/passes/patterns/compressed_attention.py": Tests(_lit("insert-cached-attention-compressed"),
                                                             ("tests/models/test_compressed_attention.py", "-k",
                                                              "greedy")),
    "ad_mlir/passes/patterns/sparse_attention.py": Tests(_lit("insert-cached-attention-dsa"),
                                                         ("tests/models/test_sparse_attention.py", "-k",
                                                          "greedy and deepseek_v32")),
    "ad_mlir/passes/patterns/distance_bias.py": Tests(_lit("insert-cached-attention", "insert-cached-attention-errors"),
                                                      ("tests/models/test_inkling.py", "-k",
                                                       "step_logits and not inkling2")),
    "ad_mlir/passes/patterns/token_window.py": Tests(_lit(*_CACHED),
                                                     ("tests/models/test_sequence_mixers.py",
                                                      "tests/models/test_inkling.py", _NEAR_MISSES, "-k",
                                                      "(zaya or inkling2) and (logits or chunks) or token_window")),
    "ad_mlir/passes/patterns/step_positions.py": Tests(_lit("insert-cached-attention", "insert-cached-attention-errors",
                                                            "insert-cached-attention-paged"),
                                                       ("tests/models/test_counted_positions.py", _NEAR_MISSES, "-k",
                                                        "not interpreter and not near_misses or step_positions")),
    "ad_mlir/passes/patterns/matching.py": Tests(_lit("fuse-rope-attention", "match-rmsnorm", "match-layernorm",
                                                      "fuse-silu-mul", "match-moe", *_CACHED),
                                                 ("tests/unit/test_matching.py",)),
    "ad_mlir/passes/patterns/pattern_pass.py": Tests(_lit("fuse-silu-mul", "fuse-add-rmsnorm", "match-rmsnorm",
                                                          "match-layernorm"),  # three patterns in one walk
                                                     ("tests/unit/test_pass_logs.py",)),
    "ad_mlir/passes/patterns/regions.py": Tests(_lit("fuse-elementwise", _TRITON)),
    "ad_mlir/passes/patterns/rope.py": Tests(_lit("fuse-rope-attention", "optimize-rope"), (_NEAR_MISSES, "-k", "rope")),
    # codegen: the kernels' own tests in the interpreter (PTX tests left out: seconds each)
    "ad_mlir/codegen/__init__.py": Tests((_TRITON,)),
    "ad_mlir/codegen/cache.py": Tests((), ("tests/unit/test_kernel_cache.py",)),
    "ad_mlir/codegen/emitters.py": Tests((_TRITON,), ("tests/unit/test_emitters.py", "tests/unit/test_llm_ops.py",
                                                       "tests/unit/test_kernel_ops.py")),
    "ad_mlir/codegen/interpreter.py": Tests((), ("tests/unit/test_interpreter_switch.py",
                                                 "tests/unit/test_linear_fp8_block_kernel.py::"
                                                 "test_kernel_equals_the_reference_on_random_activations")),
    "ad_mlir/codegen/launch.py": Tests((), _NUMERIC),
    "ad_mlir/codegen/lowering.py": Tests((), ("tests/unit/test_llm_ops.py", "tests/unit/test_kernel_ops.py",
                                              "tests/unit/test_verify.py::test_compile_verify_checks_the_cached_attention_kernel")),
    "ad_mlir/codegen/ptx.py": Tests((), ("tests/unit/test_ptx.py", "-k", "vectorized or rejects")),
    "ad_mlir/codegen/target.py": Tests(_lit(_TRITON, "fuse-rope-attention", "optimize-rope")),
    "ad_mlir/codegen/templates/__init__.py": Tests((_TRITON,)),
    "ad_mlir/codegen/templates/attention_kernel.py": Tests(
        (), ("tests/unit/test_attention_kernel.py", "-k", "not ptx and not sliding_window_matches and not any_head_dim "
             "and not rope_causal_gqa and not qk_norm and not random_mask")),
    "ad_mlir/codegen/templates/blocks.py": Tests((_TRITON,), _NUMERIC),
    "ad_mlir/codegen/templates/cached_attention_kernel.py": Tests(
        (), ("tests/unit/test_cached_attention_kernel.py", "tests/unit/test_paged_attention.py",
             "tests/unit/test_cached_attention_fp8.py", "-k",
             "not ptx and not prefill_and_chunked and not split_boundaries and not any_head_dim")),
    "ad_mlir/codegen/templates/causal_conv_kernel.py": Tests(
        (), ("tests/unit/test_causal_conv_kernel.py", "-k", "not ptx")),
    "ad_mlir/codegen/templates/gated_delta_rule_kernel.py": Tests(
        (), ("tests/unit/test_recurrent_state_kernels.py", "-k", "gated_delta_rule and not ptx")),
    "ad_mlir/codegen/templates/index_topk_kernel.py": Tests(
        (), ("tests/unit/test_index_topk_kernel.py", "-k", "not ptx")),
    "ad_mlir/codegen/templates/mla_attention_kernel.py": Tests((), ("tests/unit/test_mla_kernel.py", "-k", "not ptx")),
    "ad_mlir/codegen/templates/moe_kernel.py": Tests((), ("tests/unit/test_moe_kernel.py", "-k", "not ptx")),
    "ad_mlir/codegen/templates/moe_mxfp4_kernel.py": Tests((), ("tests/unit/test_moe_mxfp4_kernel.py", "-k", "not ptx")),
    "ad_mlir/codegen/templates/moe_fp8_block_kernel.py": Tests((), ("tests/unit/test_moe_fp8_block_kernel.py", "-k",
                                                                     "not ptx")),
    "ad_mlir/codegen/templates/linear_fp8_kernel.py": Tests((), ("tests/unit/test_linear_fp8_kernel.py", "-k",
                                                                 "not ptx")),
    "ad_mlir/codegen/templates/linear_fp8_block_kernel.py": Tests((), ("tests/unit/test_linear_fp8_block_kernel.py",
                                                                      "-k", "not ptx")),
    "ad_mlir/codegen/templates/linear_nvfp4_kernel.py": Tests((), ("tests/unit/test_linear_nvfp4_kernel.py", "-k",
                                                                   "not ptx")),
    "ad_mlir/codegen/templates/linear_int4_kernel.py": Tests((), ("tests/unit/test_linear_int4_kernel.py", "-k",
                                                                  "not ptx")),
    "ad_mlir/codegen/templates/region_kernel.py": Tests((_TRITON,), (*_NUMERIC, *_REGIONS)),
    "ad_mlir/codegen/templates/rope_kernel.py": Tests(
        _lit("optimize-rope"), ("tests/unit/test_llm_ops.py", "-k", "rope")),
    "ad_mlir/codegen/templates/rg_lru_kernel.py": Tests((), ("tests/unit/test_rg_lru_kernel.py", "-k", "not ptx")),
    "ad_mlir/codegen/templates/wkv_kernel.py": Tests((), ("tests/unit/test_wkv_kernel.py", "-k", "not ptx")),
    "ad_mlir/codegen/templates/selective_scan_kernel.py": Tests(
        (), ("tests/unit/test_selective_scan_kernel.py", "-k", "not ptx")),
    "ad_mlir/codegen/templates/skeleton.py": Tests((_TRITON,), _NUMERIC),
    "ad_mlir/codegen/templates/ssm_scan_kernel.py": Tests(
        (), ("tests/unit/test_recurrent_state_kernels.py", "-k", "ssm and not ptx")),
    "ad_mlir/codegen/templates/state_rows.py": Tests(
        (), ("tests/unit/test_causal_conv_kernel.py", "tests/unit/test_recurrent_state_kernels.py",
             "tests/unit/test_selective_scan_kernel.py", "-k", "not ptx")),
    "ad_mlir/codegen/templates/writer.py": Tests((_TRITON,), _NUMERIC),
    # runtime: the compiled graph's export, the kernels' registration, the kernel check
    "ad_mlir/runtime/__init__.py": Tests((), ("tests/unit/test_kernel_ops.py",)),
    "ad_mlir/runtime/bound_launch.py": Tests((), ("tests/unit/test_bound_launch.py",)),
    "ad_mlir/runtime/fx_export.py": Tests((), ("tests/unit/test_import_export.py", "tests/unit/test_kernel_ops.py")),
    "ad_mlir/runtime/kernels.py": Tests((), (*_NUMERIC, "tests/unit/test_llm_ops.py",
                                             "tests/unit/test_kernel_cache.py::test_second_compile_generates_nothing",
                                             "-k", "kernel or second_compile")),
    "ad_mlir/runtime/program_cache.py": Tests((), ("tests/unit/test_program_cache.py",)),
    "ad_mlir/runtime/verify.py": Tests((), ("tests/unit/test_verify.py", "-k", "compile_verify")),
    # frontends: the graphs a user holds, imported; HF's methods patched for the export
    "ad_mlir/frontends/__init__.py": Tests((), ("tests/unit/test_import_export.py",)),
    "ad_mlir/frontends/export.py": Tests((), _FRONT_DOOR),
    "ad_mlir/frontends/export_key.py": Tests((), ("tests/unit/test_module_cache.py", "-k", "not new_process")),
    "ad_mlir/frontends/export_patches.py": Tests((), ("tests/models/test_export_patches.py", "-k",
                                                      "not inkling2_text and not aria")),
    "ad_mlir/frontends/fx_import.py": Tests((), ("tests/unit/test_import_export.py", *_FRONT_DOOR)),
    "ad_mlir/frontends/graph_sources.py": Tests((), _FRONT_DOOR),
    "ad_mlir/frontends/input_checks.py": Tests((), ("tests/unit/test_front_door.py", "-k", "not inductor")),
    "ad_mlir/frontends/torch_patches.py": Tests((), ("tests/unit/test_torch_patches.py",
                                                     "tests/models/test_export_for_cache.py", "-k",
                                                     "torch_2_11 or multiples or collapse")),
    # llm: the runtime (llm.py whole: caches, steps, generate), the pages, the engines, the CLI
    "ad_mlir/llm/__init__.py": Tests((), ("tests/unit/test_pages.py",)),
    "ad_mlir/llm/engine.py": Tests((), ("tests/models/test_paged_engine.py", "tests/models/test_engine.py",
                                        "tests/models/test_speculative.py", "tests/models/test_eagle3.py")),
    "ad_mlir/llm/generate.py": Tests((), ("tests/models/test_llm_runtime.py::test_the_command_line_takes_a_budget",
                                          "tests/test_clis.py::test_generate_cli_batch_in_fewer_slots_gives_hf_tokens_"
                                          "and_benchmarks")),
    "ad_mlir/llm/cache_export.py": Tests((), ("tests/models/test_export_for_cache.py",)),
    "ad_mlir/llm/cuda_graphs.py": Tests((), (
        "tests/models/test_paged.py::test_a_decode_step_padded_to_its_cuda_graph_bucket_gives_the_same_logits",
        "tests/models/test_llm_runtime.py", "-k", "bucket or padded or graphs")),
    "ad_mlir/llm/piecewise.py": Tests((), ("tests/models/test_piecewise.py",)),
    "ad_mlir/llm/pipelines.py": Tests((), (
        "tests/unit/test_generate_sharded.py::test_cache_insertion_goes_after_shard_and_fusions_and_before_regions",
        "tests/models/test_generate_fp8_kv.py::test_fp8_pages_take_half_the_bytes_and_a_budget_buys_twice_the_pages")),
    "ad_mlir/llm/llm.py": Tests(_lit(*_CACHED), (
        "tests/models/test_llm_runtime.py", "-k", "not command_line",
        "tests/unit/test_generate_sharded.py::test_cache_insertion_goes_after_shard_and_fusions_and_before_regions",
        "tests/models/test_sequence_mixers.py::test_a_byte_budget_leaves_a_model_of_states_alone_at_its_longest",
        "tests/models/test_paged.py::test_a_byte_budget_buys_whole_pages",
        "tests/models/test_paged.py::test_steps_that_forget_the_pages_are_seen",
        "tests/models/test_paged.py::test_generate_runs_the_paged_scheduler_on_the_compiled_model",
        "tests/models/test_generate_fp8_kv.py::test_fp8_pages_take_half_the_bytes_and_a_budget_buys_twice_the_pages")),
    "ad_mlir/llm/pages.py": Tests((), ("tests/unit/test_pages.py", *(_PAGED_ENGINE + t for t in (
        "a_pool_too_small_for_all_preempts_the_youngest_and_loses_nothing",
        "preemption_with_prefix_caching_resumes_on_its_own_cached_pages", "a_common_system_prompt_is_prefilled_once_and_shared",
        "a_prompt_of_whole_pages_recomputes_its_last_page", "an_abort_frees_the_pages",
        "a_request_that_can_never_fit_the_pool_is_refused_at_add", "unchained_page_keys_would_share_wrong_pages")))),
    "ad_mlir/llm/ranks.py": Tests((), ("tests/unit/test_ranks.py",)),
    "ad_mlir/llm/sampling.py": Tests((), ("tests/models/test_speculative.py", "tests/models/test_paged_engine.py",
                                          "-k", "distribution or sampled")),
    "ad_mlir/llm/speculative.py": Tests((), ("tests/models/test_speculative.py", "tests/models/test_eagle3.py")),
    "ad_mlir/llm/eagle3.py": Tests((), ("tests/models/test_eagle3.py",)),
    "ad_mlir/llm/structured.py": Tests((), ("tests/models/test_serve_fields.py", "-k",
                                            "json or schema or grammar or structured")),
    # serve: the HTTP layer, the engine's thread, the command line
    "ad_mlir/serve/__init__.py": Tests((), ("tests/models/test_serve.py", "-k", "health")),
    # not the CLI's test (serve/cli.py's) nor those of the server with SmolLM2's tokenizer (structured.py's)
    "ad_mlir/serve/app.py": Tests((), ("tests/models/test_serve.py", "tests/models/test_serve_fields.py", "-k",
                                       "not smollm2 and not json and not schema and not grammar and not structured "
                                       "and not chat and not stop_list")),
    "ad_mlir/serve/cli.py": Tests((), ("tests/models/test_serve.py::test_ad_mlir_serve_smollm2_answers_the_openai_client",
                                       f"{_SERVE_TP}test_serve_on_two_ranks_answers_as_one_rank_and_stops_the_rank_it_"
                                       "started")),
    "ad_mlir/serve/ranks.py": Tests((), (f"{_SERVE_TP}test_serve_on_two_ranks_answers_as_one_rank_and_stops_the_rank_"
                                         "it_started", f"{_SERVE_TP}test_a_rank_that_dies_stops_the_server_within_the_"
                                         "keepalive", f"{_SERVE_TP}test_the_rank_started_here_takes_the_first_gpu")),
    "ad_mlir/serve/runner.py": Tests((), ("tests/models/test_serve.py", "tests/models/test_serve_paged.py", "-k",
                                          "not smollm2 and (not test_serve_paged or cancel or goes_away or failed "
                                          "or soak)")),
}
"""Source file (relative to the repository) -> the tests its mutants run against. Every file
that `mutated_files` returns has an entry (tests/unit/test_mutation.py checks it)."""

FOLDERS = ("passes", "codegen", "runtime", "frontends", "llm", "serve")
"""The folders of `ad_mlir/` whose modules are mutated."""


def mutated_files(commit: str = "HEAD", root: Path = ROOT) -> list[str]:
    """The files mutated: every module of `FOLDERS` committed at `commit`."""
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", commit, "--", *(f"ad_mlir/{d}" for d in FOLDERS)],
                            cwd=root, check=True, capture_output=True, text=True).stdout.split()
    return sorted(f for f in listed if f.endswith(".py"))


def folder(file: str) -> str:
    """The folder of `ad_mlir/` that `file` is in (`passes` for passes/patterns/ too)."""
    parts = file.split("/")
    return parts[1] if len(parts) > 2 else ""


@dataclass(frozen=True)
class Mutant:
    """One mutation: cosmic-ray's operator applied at its `occurrence` in `file`."""

    file: str
    operator: str
    occurrence: int
    line: int
    column: int
    end: tuple[int, int]
    mutation: str = ""
    """The mutated source line, as `old -> new` (filled in by `describe`)."""

    @property
    def id(self) -> str:
        return f"{self.file}:{self.operator}:{self.occurrence}"

    @property
    def site(self) -> tuple[str, int, int]:
        return self.file, self.line, self.column


Span = tuple[tuple[int, int], tuple[int, int]]


def annotation_spans(tree: ast.AST) -> list[Span]:
    """((line, column), (end line, end column)) of every type annotation."""
    found = [n.annotation for n in ast.walk(tree) if isinstance(n, ast.arg | ast.AnnAssign) and n.annotation]
    found += [n.returns for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.returns]
    return [((a.lineno, a.col_offset), (a.end_lineno or a.lineno, a.end_col_offset or 0)) for a in found]


def _inside(position: tuple[int, int], spans: Sequence[Span]) -> bool:
    return any(start <= position < end for start, end in spans)


def enumerate_mutants(root: Path, file: str) -> list[Mutant]:
    """Every mutant cosmic-ray's operators make of `file` (sites in annotations left out)."""
    import cosmic_ray.plugins
    from cosmic_ray.ast import ast_nodes, get_ast_from_path

    source = (root / file).read_text()
    tree = ast.parse(source)
    annotations = annotation_spans(tree)
    module = get_ast_from_path(root / file)
    mutants = []
    for name in cosmic_ray.plugins.operator_names():
        operator_class = cosmic_ray.plugins.get_operator(name)
        if operator_class.arguments():  # VariableReplacer/-Inserter need a variable named
            continue
        operator = operator_class()
        positions = [span for node in ast_nodes(module) for span in operator.mutation_positions(node)]
        for occurrence, ((line, column), end) in enumerate(positions):
            if _inside((line, column), annotations):
                continue
            mutants.append(Mutant(file, name, occurrence, line, column, tuple(end)))
    return mutants


def shares(sizes: dict[str, int], sample: int) -> dict[str, int]:
    """`sample` split over the groups in proportion to `sizes`: the whole parts first, then one
    more to each of the largest remainders (ties by name)."""
    total = sum(sizes.values())
    sample = min(sample, total)
    exact = {k: sample * n / max(total, 1) for k, n in sizes.items()}
    counts = {k: int(x) for k, x in exact.items()}
    for k in sorted(sizes, key=lambda k: (counts[k] - exact[k], k))[:sample - sum(counts.values())]:
        counts[k] += 1
    return counts


def draw(mutants: Sequence[Mutant], sample: int, seed: int) -> list[Mutant]:
    """`sample` sites drawn at random (seeded), each folder's share in proportion to its sites,
    one mutant each, drawn among the site's."""
    by_site: dict[tuple[str, int, int], list[Mutant]] = {}
    for m in mutants:
        by_site.setdefault(m.site, []).append(m)
    by_folder: dict[str, list[tuple[str, int, int]]] = {}
    for site in sorted(by_site):
        by_folder.setdefault(folder(site[0]), []).append(site)
    rng = random.Random(seed)
    counts = shares({k: len(v) for k, v in by_folder.items()}, sample)
    sites = [s for k in sorted(by_folder) for s in rng.sample(by_folder[k], counts[k])]
    return sorted((rng.choice(by_site[s]) for s in sites), key=lambda m: (m.file, m.line, m.column, m.operator))


def describe(root: Path, mutant: Mutant) -> Mutant:
    """`mutant` with its `mutation`: the changed source line(s), old -> new."""
    import cosmic_ray.plugins
    from cosmic_ray.mutating import mutate_code

    source = (root / mutant.file).read_text()
    mutated = mutate_code(source, cosmic_ray.plugins.get_operator(mutant.operator)(), mutant.occurrence)
    if mutated is None:
        return dataclasses.replace(mutant, mutation="(no mutation applies)")
    diff = difflib.unified_diff(source.splitlines(), mutated.splitlines(), n=0, lineterm="")
    changed = [d for d in diff if d[:1] in "+-" and not d.startswith(("+++", "---"))]
    old = " / ".join(d[1:].strip() for d in changed if d[0] == "-")
    new = " / ".join(d[1:].strip() for d in changed if d[0] == "+")
    return dataclasses.replace(mutant, mutation=f"{old} -> {new or '(removed)'}")


def full_commit(commit: str, root: Path = ROOT) -> str:
    return subprocess.run(["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()


def scratch_copy(root: Path, into: Path, commit: str) -> Path:
    """The repository's files as committed at `commit`, exported to `into`/repo."""
    copy = into / "repo"
    copy.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=root, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(copy)], input=archive.stdout, check=True)
    return copy


def restore(root: Path, copy: Path, commit: str, files: Sequence[str]) -> list[str]:
    """`files` in `copy` put back as they were at `commit` (the first run's text, which the
    mutants' occurrences count in); returns those that had changed since."""
    changed = []
    for file in sorted(set(files)):
        old = subprocess.run(["git", "show", f"{commit}:{file}"], cwd=root, check=True, capture_output=True).stdout
        if (copy / file).read_bytes() != old:
            (copy / file).write_bytes(old)
            changed.append(file)
    return changed


def test_command(copy: Path, tests: Tests) -> str:
    """One shell command that runs `tests` in the scratch copy and fails if any fails."""
    bin_dir = Path(sys.executable).parent
    parts = []
    if tests.lit:
        parts.append(shlex.join([str(bin_dir / "lit"), "-q", *tests.lit]))
    if tests.pytest:
        parts.append(shlex.join([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                 "-p", "no:randomly", *tests.pytest]))
    script = f"cd {shlex.quote(str(copy))} && " + " && ".join(parts)
    return shlex.join(["bash", "-c", script])


def _run(command: str, timeout: float) -> tuple[str, str]:
    """cosmic-ray's test runner: ("killed" | "timeout" | "survived", output)."""
    from cosmic_ray.testing import run_tests

    outcome, output = run_tests(command, timeout)
    if output == "timeout":
        return "timeout", output
    return ("killed" if outcome == "killed" else "survived"), output


def _first_failure(output: str) -> str:
    """The first failing test named in pytest's or lit's output ("" when none is)."""
    for line in output.splitlines():
        if line.startswith(("FAILED ", "FAIL: ", "ERROR ")):
            return line.split(" - ")[0].strip()
    return ""


@dataclass
class Scratch:
    """A scratch copy of the repository that the tests run in, and the temporary directory they use."""

    repo: Path
    tmp: Path

    @classmethod
    def make(cls, root: Path, into: Path, commit: str) -> Scratch:
        scratch = cls(scratch_copy(root, into, commit), into / "tmp")
        scratch.tmp.mkdir()
        # The tests import the copy, not the working tree the editable install points at.
        os.environ["PYTHONPATH"] = str(scratch.repo)
        os.environ["TMPDIR"] = str(scratch.tmp)
        return scratch

    def clean_tmp(self) -> None:
        """Each run's kernel cache and temporary files go: no mutant reuses another's kernels."""
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir()


def baseline(scratch: Scratch, file: str) -> float:
    """Seconds `file`'s tests take unmutated; raises when they fail (every mutant would count as
    killed)."""
    start = time.monotonic()
    status, output = _run(test_command(scratch.repo, TESTS[file]), 1800)
    scratch.clean_tmp()
    if status != "survived":
        raise RuntimeError(f"the tests of {file} fail without a mutation ({status}):\n{output[-3000:]}")
    seconds = round(time.monotonic() - start, 1)
    print(f"baseline {file}: {seconds} s", flush=True)
    return seconds


def run_mutant(scratch: Scratch, mutant: Mutant, timeout: float) -> dict[str, Any]:
    """Applies `mutant` in the scratch copy, runs its file's tests, puts the file back."""
    from cosmic_ray.mutating import mutate_and_test
    from cosmic_ray.work_item import MutationSpec, WorkerOutcome

    spec = MutationSpec(module_path=scratch.repo / mutant.file, operator_name=mutant.operator,
                        occurrence=mutant.occurrence, start_pos=(mutant.line, mutant.column), end_pos=mutant.end)
    start = time.monotonic()
    result = mutate_and_test([spec], test_command(scratch.repo, TESTS[mutant.file]), timeout)
    scratch.clean_tmp()
    output = result.output or ""
    if result.worker_outcome == WorkerOutcome.NO_TEST:
        status = "no mutation"
    elif result.worker_outcome != WorkerOutcome.NORMAL:
        status = "error"
    else:
        status = "timeout" if output == "timeout" else str(result.test_outcome.value)
    return {"status": status, "seconds": round(time.monotonic() - start, 1),
            "killed_by": _first_failure(output), "date": _now()}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def machine() -> dict[str, Any]:
    """What ran the mutants: the CPU, cores, memory, Python and torch, and the load."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    memory = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal")), "0") if Path("/proc/meminfo").exists() else "0"
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
            "memory_gib": round(int(memory) / 2**20, 1), "python": platform.python_version(),
            "torch": metadata.version("torch"), "load_average_at_start": os.getloadavg()}


KILLED = ("killed", "timeout")


def score(mutants: Sequence[dict[str, Any]], after_rerun: bool = False) -> dict[str, Any]:
    """Killed (a failing test or a timeout) over the mutants that ran."""
    def status(m: dict[str, Any]) -> str:
        return m["rerun"]["status"] if after_rerun and "rerun" in m else m.get("status", "not run")

    ran = [m for m in mutants if status(m) in (*KILLED, "survived")]
    killed = sum(status(m) in KILLED for m in ran)
    return {"killed": killed, "survived": len(ran) - killed, "ran": len(ran),
            "not_run": len(mutants) - len(ran), "percent": round(100 * killed / max(len(ran), 1), 1)}


def _by_folder(mutants: Sequence[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in mutants:
        counts[folder(m["file"])] = counts.get(folder(m["file"]), 0) + 1
    return dict(sorted(counts.items()))


def write(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    results["score"] = score(results["mutants"])
    results["score_by_folder"] = {k: score([m for m in results["mutants"] if folder(m["file"]) == k])
                                  for k in _by_folder(results["mutants"])}
    if any("rerun" in m for m in results["mutants"]):
        results["score_after_new_tests"] = score(results["mutants"], after_rerun=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(report(results, _notes(out)))


def _notes(out: Path) -> dict[str, str]:
    path = out / "notes.json"
    return json.loads(path.read_text()) if path.exists() else {}


def report(results: dict[str, Any], notes: dict[str, str]) -> str:
    """results.md: the run, the score, and every survivor with its explanation."""
    s = results["score"]
    m = results["machine"]
    lines = [
        "# Mutation run", "",
        f"`{results['command']}`, {results['started']} to {results.get('finished', '(unfinished)')} "
        f"({results.get('wall_s', 0) / 60:.0f} min).", "",
        f"- tool: {results['tool']} ({', '.join(results['operators'])})",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['platform']}, Python {m['python']}, "
        f"torch {m['torch']}; load average at start {', '.join(f'{x:.1f}' for x in m['load_average_at_start'])}"
        f"{'; ' + results['machine_note'] if results.get('machine_note') else ''}",
        f"- mutated: the modules of {', '.join(f'{k}/' for k in results['sites_by_folder'])} as committed at "
        f"{results['commit'][:10]}; {results['sites']} sites "
        f"({', '.join(f'{k} {n}' for k, n in results['sites_by_folder'].items())}), "
        f"{results['mutants_total']} mutants in all",
        f"- sample: {results['sample']} sites (seed {results['seed']}), one mutant each, in proportion to each folder's "
        f"sites: {', '.join(f'{k} {n}' for k, n in _by_folder(results['mutants']).items())}; "
        f"{len(results['files'])} files drawn",
        *([f"- stopped and resumed (`--resume`, baselines kept): {'; '.join(results['resumed'])}"]
          if results.get("resumed") else []),
        *([f"- survivors run again: `{results['rerun']['command']}` (tests as committed at "
           f"{results['rerun']['commit'][:10]}), {results['rerun']['started']} to "
           f"{results['rerun'].get('finished', '(unfinished)')}"] if "rerun" in results else []),
        f"- **score: {s['killed']} killed / {s['ran']} run = {s['percent']}%** ({s['survived']} survived, "
        f"{s['not_run']} not run)",
    ]
    after = results.get("score_after_new_tests")
    if after:
        lines.append(f"- **after the new tests (survivors run again): {after['killed']} / {after['ran']} = "
                     f"{after['percent']}%**")
    survivors = [m for m in results["mutants"] if m.get("status") == "survived"]
    kinds = {kind: sum(notes.get(m["id"], "").startswith(kind) for m in survivors)
             for kind in ("killed by", "equivalent", "not killed")}
    if survivors:
        equivalent = kinds["equivalent"]
        lines.append(f"- survivors: {kinds['killed by']} killed by tests added since, {equivalent} equivalent, "
                     f"{kinds['not killed']} not killed yet, {len(survivors) - sum(kinds.values())} unexplained"
                     + (f"; without the equivalent mutants: {after['killed']} / {after['ran'] - equivalent} = "
                        f"{100 * after['killed'] / max(after['ran'] - equivalent, 1):.1f}%" if after else ""))
    lines += ["", "## Survivors", "",
              "| mutant | line | mutation | run again | explanation |", "|---|---|---|---|---|"]
    for mut in results["mutants"]:
        if mut.get("status") != "survived":
            continue
        again = mut.get("rerun", {}).get("status", "")
        note = notes.get(mut["id"], "(not yet explained)").replace("|", "\\|")
        change = mut["mutation"].replace("|", "\\|")
        lines.append(f"| `{mut['operator'].split('/')[-1]}` #{mut['occurrence']} | {mut['file']}:{mut['line']} | "
                     f"`{change}` | {again} | {note} |")
    lines += ["", "## Per folder", "", "| folder | sites | mutants | killed | survived | score |", "|---|---|---|---|---|---|"]
    for k, f in results["score_by_folder"].items():
        lines.append(f"| {k}/ | {results['sites_by_folder'].get(k, '')} | {f['ran'] + f['not_run']} | {f['killed']} | "
                     f"{f['survived']} | {f['percent']}% |")
    lines += ["", "## Per file", "", "| file | mutants | killed | baseline s | tests |", "|---|---|---|---|---|"]
    for file, info in sorted(results["files"].items()):
        mine = [x for x in results["mutants"] if x["file"] == file]
        tests = " ".join(info["tests"]["lit"] + info["tests"]["pytest"])
        again = info.get("rerun_tests")
        if again and again != info["tests"]:
            tests += "; run again with: " + " ".join(again["lit"] + again["pytest"])
        lines.append(f"| {file} | {len(mine)} | {sum(x.get('status') in KILLED for x in mine)} | "
                     f"{info.get('baseline_s', '')} | {tests} |")
    return "\n".join(lines) + "\n"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ad_mlir.bench.mutation", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--sample", type=int, default=120, help="mutation sites drawn (default 120)")
    p.add_argument("--seed", type=int, default=39, help="the draw's seed (default 39)")
    p.add_argument("--files", nargs="*", default=None,
                   help="mutate only these files (paths as in TESTS); default: every mapped file")
    p.add_argument("--commit", default="HEAD", help="the commit whose files are mutated and tested (default HEAD; "
                   "--rerun: the tests' commit, each survivor's file as in the first run)")
    p.add_argument("--out", type=Path, default=OUT, help="results directory (default benchmarks/results/mutation)")
    p.add_argument("--timeout-factor", type=float, default=3.0,
                   help="a mutant's tests time out at this many times the unmutated run (default 3)")
    p.add_argument("--min-timeout", type=float, default=60.0, help="seconds, at least (default 60)")
    p.add_argument("--machine-note", default="", help="a line about the machine recorded with the results")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--list", action="store_true", help="print the sample and stop")
    mode.add_argument("--resume", action="store_true", help="go on with an unfinished run in --out")
    mode.add_argument("--rerun", action="store_true", help="run the survivors in --out again (after new tests)")
    mode.add_argument("--report", action="store_true", help="write results.md again from results.json and notes.json")
    return p.parse_args(argv)


def _need_cosmic_ray() -> str:
    try:
        return metadata.version("cosmic-ray")
    except metadata.PackageNotFoundError:
        sys.exit("the mutation run needs cosmic-ray: pip install -e '.[mutation]'")


def new_run(args: argparse.Namespace, argv: Sequence[str] | None, repo: Path, commit: str) -> dict[str, Any]:
    """The sample of `repo` (the files as committed at `commit`) and the run's description,
    before anything runs."""
    import cosmic_ray.plugins

    files = args.files or mutated_files(commit)
    unknown = [f for f in files if f not in TESTS]
    if unknown:
        sys.exit(f"no tests mapped for {unknown} (TESTS in {__file__})")
    everything = [m for f in files for m in enumerate_mutants(repo, f)]
    sample = [describe(repo, m) for m in draw(everything, args.sample, args.seed)]
    sites: dict[str, set[tuple[str, int, int]]] = {}
    for m in everything:
        sites.setdefault(folder(m.file), set()).add(m.site)
    return {
        "command": " ".join(["python -m ad_mlir.bench.mutation", shlex.join(argv if argv is not None else sys.argv[1:])]),
        "commit": commit,
        "tool": f"cosmic-ray {_need_cosmic_ray()}",
        "operators": sorted({n.split("_")[0].split("/")[-1] for n in cosmic_ray.plugins.operator_names()
                             if not cosmic_ray.plugins.get_operator(n).arguments()}),
        "machine": machine(), "machine_note": args.machine_note,
        "seed": args.seed, "sample": args.sample, "started": _now(),
        "sites": len({m.site for m in everything}), "mutants_total": len(everything),
        "sites_by_folder": {k: len(v) for k, v in sorted(sites.items())},
        "files": {f: {"tests": dataclasses.asdict(TESTS[f])} for f in sorted({m.file for m in sample})},
        "mutants": [{"id": m.id, **dataclasses.asdict(m)} for m in sample],
    }


def execute(results: dict[str, Any], args: argparse.Namespace, scratch: Scratch, rerun: bool) -> None:
    """Runs the mutants not yet run (or, with `rerun`, the survivors again) in `scratch`, saving
    after each."""
    todo = [m for m in results["mutants"] if (m["status"] == "survived" if rerun else "status" not in m)]
    if rerun:
        commit = full_commit(args.commit)
        restored = restore(ROOT, scratch.repo, results["commit"], [m["file"] for m in todo])
        results["rerun"] = {"command": "python -m ad_mlir.bench.mutation --rerun" + (
            f" --commit {args.commit}" if args.commit != "HEAD" else ""), "commit": commit, "started": _now(),
            "mutated_files_as_in_the_first_run": restored}
    if args.resume:
        results.setdefault("resumed", []).append(f"{_now()}: {sum('status' in m for m in results['mutants'])} "
                                                 "mutants had run")
    write(results, args.out)  # the sample, before anything runs
    key = "rerun_baseline_s" if rerun else "baseline_s"
    for file in sorted({m["file"] for m in todo}):
        info = results["files"][file]
        if key in info and args.resume:  # measured before the run stopped, at the same commit
            continue
        info[key] = baseline(scratch, file)
        if rerun:  # the tests may have grown since (tests that kill survivors)
            info["rerun_tests"] = dataclasses.asdict(TESTS[file])
        write(results, args.out)
    seconds = {file: info[key] for file, info in results["files"].items() if key in info}
    start = time.monotonic()
    for i, m in enumerate(todo, 1):
        mutant = Mutant(**{k: m[k] for k in ("file", "operator", "occurrence", "line", "column")},
                        end=tuple(m["end"]))
        timeout = max(args.min_timeout, args.timeout_factor * seconds[m["file"]])
        outcome = run_mutant(scratch, mutant, timeout)
        if rerun:
            m["rerun"] = outcome
        else:
            m.update(outcome)
        elapsed = time.monotonic() - start
        print(f"[{i}/{len(todo)} {elapsed / 60:.0f} min] {outcome['status']:>9} {outcome['seconds']:6.1f} s "
              f"{m['file']}:{m['line']} {m['mutation'][:90]}", flush=True)
        write(results, args.out)
    if rerun:
        results["rerun"]["finished"] = _now()
    else:
        results["finished"] = _now()
        results["wall_s"] = round(sum(m.get("seconds", 0) for m in results["mutants"]) + sum(seconds.values()))
        results["machine"]["load_average_at_end"] = os.getloadavg()
    write(results, args.out)


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse(argv)
    _need_cosmic_ray()
    saved = args.out / "results.json"
    results = json.loads(saved.read_text()) if args.report or args.rerun or args.resume else None
    if args.report:
        write(results, args.out)
        print(f"score {results['score']}; {args.out / 'results.md'}")
        return
    commit = results["commit"] if args.resume else full_commit(args.commit)
    with tempfile.TemporaryDirectory(prefix="ad_mlir_mutation_") as tmp:
        scratch = Scratch.make(ROOT, Path(tmp), commit)
        if results is None:
            results = new_run(args, argv, scratch.repo, commit)
            if args.list:
                for m in results["mutants"]:
                    print(f"{m['file']}:{m['line']} {m['operator']} #{m['occurrence']}: {m['mutation']}")
                print(f"{len(results['mutants'])} of {results['mutants_total']} mutants ({results['sites']} sites); "
                      f"by folder: {_by_folder(results['mutants'])}")
                return
        execute(results, args, scratch, rerun=args.rerun)
    print(f"score {results['score']}; {args.out / 'results.md'}")


if __name__ == "__main__":
    main()
