"""`ad-mlir`: the command line of the serving runtime.

    ad-mlir serve                                  # SmolLM2-135M-Instruct on http://127.0.0.1:8000
    ad-mlir serve --model llama --port 8001        # a tiny built-in family (random weights, token-id prompts)
    ad-mlir serve --model path/to/model.gguf --max-batch 8 --max-seq-len 1024
    ad-mlir serve --model qwen3 --tensor-parallel-size 2   # the model sharded over 2 ranks of this machine
    ad-mlir serve --speculative-ngram 4            # speculative decoding: drafts by prompt lookup
    ad-mlir serve --model M --speculative-eagle3 path/to/head --speculative-tokens 3   # drafts by an EAGLE-3 head

The server speaks OpenAI's API (`/v1/completions`, `/v1/chat/completions`, streaming or not,
`/v1/models`), with `/health` and Prometheus `/metrics`; any OpenAI client works against
`http://HOST:PORT/v1`. Where a GPU is visible the model runs there in bfloat16 (`--device`,
`--dtype`); on the CPU, in float32 with the kernels as their torch reference.

With --tensor-parallel-size N the model is sharded over N ranks (`shard` in the pipeline): rank 0
serves HTTP and schedules, every rank runs each step on its slice of the weights. Without torchrun
the command starts ranks 1 .. N-1 itself on this machine; under torchrun each process is one rank
(several machines through its rendezvous), e.g.
`torchrun --standalone --nproc-per-node 2 -m ad_mlir.serve.cli serve --model qwen3 --tensor-parallel-size 2`.
NCCL where every local rank has a GPU (the model on it), else gloo on the CPU.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ad_mlir.zoo.tiny import DTYPES

if TYPE_CHECKING:
    import uvicorn

    from ad_mlir.llm.engine import CachedModel, PagedModel
    from ad_mlir.llm.llm import LLM
    from ad_mlir.llm.speculative import Proposer, ReadsHiddenStates
    from ad_mlir.serve.runner import EngineRunner


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ad-mlir", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    commands = p.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                                description="Compile a model with caches and serve it over HTTP (OpenAI's API).")
    serve.add_argument("--model", default="smollm2", help="what ad_mlir.LLM takes: smollm2, a tiny family (llama, "
                       "qwen2, mistral, gemma), a checkpoint directory or a .gguf file (default: smollm2)")
    serve.add_argument("--served-model-name", default=None, help="the model's name in the API (default: --model)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-batch", type=int, default=4, help="sequences the cache is sized for (the slot form's "
                       "slots: requests decoded together)")
    serve.add_argument("--max-seq-len", type=int, default=None, help="tokens a slot holds, prompt and output "
                       "(default 512)")
    serve.add_argument("--page-size", type=int, default=16, help="tokens per page of the paged K/V cache (a power "
                       "of two; 0: the slot form). States kept per sequence (convolutions, scans) sit beside the "
                       "pages in --max-batch state slots; a model the paged form refuses (states without "
                       "attention, DeepSeek sparse attention) gets the slot form, with a warning")
    serve.add_argument("--num-pages", type=int, default=None, help="pages in the pool (default: enough for "
                       "--max-batch sequences of --max-seq-len tokens)")
    serve.add_argument("--kv-cache-dtype", default="auto", help="what attention's K/V "
                       "cache holds: auto (the model's dtype) or fp8 / fp8_e4m3 (float8_e4m3fn with per-tensor "
                       "scales of 1.0, half the bytes of bf16: twice the pages in the same memory)")
    serve.add_argument("--max-step-tokens", type=int, default=256, help="tokens one engine step feeds: the running "
                       "decodes, then chunks of waiting prompts (a longer prompt is prefilled over several steps)")
    serve.add_argument("--max-running", type=int, default=None, help="requests in the paged cache at once, at most "
                       "(the decodes of one step; default: as many as its pages hold, at most --max-batch with per-sequence "
                       "states; the slot form: its slots)")
    speculative = serve.add_mutually_exclusive_group()
    speculative.add_argument("--speculative-ngram", type=int, default=0, metavar="K", help="speculative decoding by "
                             "prompt lookup: draft up to K tokens per decode from where the sequence's last tokens "
                             "appeared before, verified in the same step (the paged form, models without per-sequence "
                             "states; the tokens are those of plain decoding; default 0: off)")
    speculative.add_argument("--speculative-model", default=None, metavar="MODEL", help="speculative decoding with a "
                             "draft model of the same tokenizer (what --model takes), compiled in the paged form beside "
                             "the model, drafting --speculative-tokens tokens per decode greedily")
    speculative.add_argument("--speculative-eagle3", default=None, metavar="PATH", help="speculative decoding with an "
                             "EAGLE-3 head (a directory in vLLM's LlamaForCausalLMEagle3 layout) fed by the model's hidden "
                             "states, which the model is compiled to return; drafting --speculative-tokens tokens per "
                             "decode greedily")
    serve.add_argument("--speculative-tokens", type=int, default=4, metavar="K", help="tokens the draft model or the "
                       "EAGLE-3 head drafts per decode (with --speculative-model or --speculative-eagle3)")
    serve.add_argument("--default-max-tokens", type=int, default=256, help="max_tokens of a request that gives "
                       "none (capped by what fits the cache after its prompt)")
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer API_KEY' on the /v1 routes")
    serve.add_argument("--pipeline", default="default", help="the compile pipeline (ad_mlir.compile's)")
    serve.add_argument("--tensor-parallel-size", type=int, default=1, help="ranks the model is sharded over "
                       "(canonicalize,match-moe,shard{world-size=N} goes before a pipeline without shard); without "
                       "torchrun this command starts the other ranks on this machine")
    serve.add_argument("--rank-timeout", type=float, default=600, help="seconds a rank waits for the others in a "
                       "collective (at start, for the slowest rank's compile; then for a rank that hangs)")
    serve.add_argument("--device", default=None, help="where the model runs: cpu, cuda, cuda:1 ... (default: cuda "
                       "where a GPU is visible, else cpu; with --tensor-parallel-size, each rank's own GPU or the CPU)")
    serve.add_argument("--dtype", default="auto", choices=("auto", *DTYPES), help="the weights' dtype (default auto: "
                       "bfloat16 on CUDA, float32 on the CPU)")
    serve.add_argument("-v", "--verbose", action="store_true", help="log the compilation and each request")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if args.tensor_parallel_size < 1:
        sys.exit(f"error: --tensor-parallel-size {args.tensor_parallel_size} must be at least 1")
    if args.tensor_parallel_size > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _serve_on_ranks(args, sys.argv[1:] if argv is None else list(argv))
        return
    start = time.perf_counter()
    llm = _compile(args, args.pipeline, args.device)
    _run(*_server(args, llm, llm, start))


def _serve_on_ranks(args: argparse.Namespace, argv: list[str]) -> None:
    """Rank 0 serves and drives the others (`RankLeader`); the others follow it until it stops."""
    import torch.distributed as dist

    from ad_mlir.llm.ranks import RankLeader, check_sharded, follow, sharded_pipeline
    from ad_mlir.serve.ranks import join

    start = time.perf_counter()
    try:
        ranks = join(args.tensor_parallel_size, args.rank_timeout, argv)
    except (ValueError, RuntimeError) as e:
        sys.exit(f"error: {e}")
    told = False  # the ranks this process started were told to stop: wait for them to leave (else: end them)
    try:
        llm = _compile(args, sharded_pipeline(args.pipeline, ranks.world_size), str(ranks.device or "cpu"))
        check_sharded(llm, ranks.world_size)
        dist.barrier()  # every rank has compiled (one that failed to has closed its connections: this raises)
        if ranks.rank > 0:
            follow(llm)
            return
        # uvicorn re-raises the SIGTERM it stopped on once it has shut down: exit through the `finally`s
        # that stop the other ranks. Not before: a Python handler waits while a collective blocks.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        leader = RankLeader(llm, keepalive_s=args.rank_timeout / 4)
        server, runner = _server(args, leader, llm, start, f"; {ranks.world_size} ranks ({ranks.backend})")
        leader.on_lost = lambda _: setattr(server, "should_exit", True)
        try:
            _run(server, runner)
        finally:
            told = leader.stop()
        if leader.lost is not None:
            sys.exit(f"error: stopped: a call failed, the ranks are out of step ({leader.lost})")
    except (ValueError, RuntimeError) as e:
        sys.exit(f"error: rank {ranks.rank}/{ranks.world_size}: {e}")
    finally:
        ranks.leave(wait_s=30 if told else 0)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _compile(args: argparse.Namespace, pipeline: str, device: str | None) -> LLM:
    """The model on `device` (None: CUDA where a GPU is visible) in `--dtype`, with its caches,
    compiled with `pipeline`."""
    from ad_mlir.llm.llm import paged_where_possible
    from ad_mlir.zoo.checkpoints import load_causal_lm

    pages = {"num_pages": args.num_pages} if args.page_size and args.num_pages else {}
    try:
        model, tokenizer = load_causal_lm(args.model, device, args.dtype)
        return paged_where_possible(model, args.page_size or None, max_batch=args.max_batch,
                                    max_seq_len=args.max_seq_len, pipeline=pipeline, tokenizer=tokenizer,
                                    kv_cache_dtype=args.kv_cache_dtype, **pages, **_compiled_proposer(args))
    except ValueError as e:
        sys.exit(f"error: {e}")


def _server(args: argparse.Namespace, model: CachedModel | PagedModel, llm: LLM, start: float,
            note: str = "") -> tuple[uvicorn.Server, EngineRunner]:
    """The HTTP server of an engine over `model` (`llm`, or rank 0's `RankLeader` of it), the engine's
    thread started."""
    import uvicorn

    from ad_mlir.llm.engine import make_engine
    from ad_mlir.llm.llm import cache_layout
    from ad_mlir.serve.app import build_app
    from ad_mlir.serve.runner import EngineRunner

    try:
        engine = make_engine(model, max_step_tokens=args.max_step_tokens, max_running=args.max_running,
                             speculative=_proposer(args, llm))
    except ValueError as e:
        sys.exit(f"error: {e}")
    name = args.served_model_name or args.model
    print(f"{name}: loaded and compiled in {time.perf_counter() - start:.1f} s; {cache_layout(llm)}{note}; serving on "
          f"http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    runner = EngineRunner(engine).start()
    app = build_app(runner, name, llm.tokenizer, default_max_tokens=args.default_max_tokens, api_key=args.api_key)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning")
    return uvicorn.Server(config), runner


def _compiled_proposer(args: argparse.Namespace) -> dict[str, ReadsHiddenStates]:
    """`LLM`'s `speculative` where the proposer is compiled with the model: an EAGLE-3 head,
    whose hidden states the model returns."""
    if getattr(args, "speculative_eagle3", None) is None:
        return {}
    from ad_mlir.llm.eagle3 import Eagle3Proposer

    return {"speculative": Eagle3Proposer(args.speculative_eagle3, args.speculative_tokens)}


def _proposer(args: argparse.Namespace, llm: LLM) -> Proposer | ReadsHiddenStates | None:
    """What drafts tokens for the engine to verify, as the command line asks: prompt lookup, or a
    draft model compiled in the paged form on the model's device, with pages for as many
    sequences of as many tokens as the model's cache."""
    from ad_mlir.llm.llm import LLM
    from ad_mlir.llm.speculative import DraftModelProposer, NgramProposer
    from ad_mlir.zoo.checkpoints import load_causal_lm

    if args.speculative_ngram:
        return NgramProposer(args.speculative_ngram)
    if args.speculative_eagle3 is not None:
        return llm.speculative
    if args.speculative_model is None:
        return None
    draft, _ = load_causal_lm(args.speculative_model, str(llm.device), args.dtype)
    return DraftModelProposer(LLM(draft, max_batch=args.max_batch, max_seq_len=llm.max_seq_len,
                                  page_size=llm.page_size or 16, pipeline=args.pipeline), args.speculative_tokens)


def _run(server: uvicorn.Server, runner: EngineRunner) -> None:
    """Serve until stopped, then stop the engine's thread."""
    try:
        server.run()
    finally:
        runner.stop()
    if not server.started:  # uvicorn logged why (e.g. the port is taken); uvicorn.run exits 3 then
        sys.exit(f"error: the server did not start on {server.config.host}:{server.config.port}")


if __name__ == "__main__":
    main()
