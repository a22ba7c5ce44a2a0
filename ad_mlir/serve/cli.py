"""`ad-mlir`: the command line of the serving runtime.

    ad-mlir serve                                  # SmolLM2-135M-Instruct on http://127.0.0.1:8000
    ad-mlir serve --model llama --port 8001        # a tiny built-in family (random weights, token-id prompts)
    ad-mlir serve --model path/to/model.gguf --max-batch 8 --max-seq-len 1024

The server speaks OpenAI's API (`/v1/completions`, `/v1/chat/completions`, streaming or not,
`/v1/models`), with `/health` and Prometheus `/metrics`; any OpenAI client works against
`http://HOST:PORT/v1`. Without CUDA the kernels run as their torch reference.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence


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
    serve.add_argument("--max-step-tokens", type=int, default=256, help="tokens one engine step feeds: the running "
                       "decodes, then chunks of waiting prompts (a longer prompt is prefilled over several steps)")
    serve.add_argument("--max-running", type=int, default=None, help="requests in the paged cache at once, at most "
                       "(the decodes of one step; default: as many as its pages hold, at most --max-batch with per-sequence "
                       "states; the slot form: its slots)")
    serve.add_argument("--default-max-tokens", type=int, default=256, help="max_tokens of a request that gives "
                       "none (capped by what fits the cache after its prompt)")
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer API_KEY' on the /v1 routes")
    serve.add_argument("--pipeline", default="default", help="the compile pipeline (ad_mlir.compile's)")
    serve.add_argument("-v", "--verbose", action="store_true", help="log the compilation and each request")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    import uvicorn

    from ad_mlir.llm.engine import make_engine
    from ad_mlir.llm.llm import cache_layout, paged_where_possible
    from ad_mlir.serve.app import build_app
    from ad_mlir.serve.runner import EngineRunner

    start = time.perf_counter()
    try:
        pages = {"num_pages": args.num_pages} if args.page_size and args.num_pages else {}
        llm = paged_where_possible(args.model, args.page_size or None, max_batch=args.max_batch,
                                   max_seq_len=args.max_seq_len, pipeline=args.pipeline, **pages)
        engine = make_engine(llm, max_step_tokens=args.max_step_tokens, max_running=args.max_running)
    except ValueError as e:
        sys.exit(f"error: {e}")
    name = args.served_model_name or args.model
    print(f"{name}: loaded and compiled in {time.perf_counter() - start:.1f} s; {cache_layout(llm)}; serving on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    runner = EngineRunner(engine).start()
    app = build_app(runner, name, llm.tokenizer, default_max_tokens=args.default_max_tokens,
                    api_key=args.api_key)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning")
    finally:
        runner.stop()
