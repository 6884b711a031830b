"""Validate vLLM command lines in-process with vLLM's own parser and config classes.

Runs inside the vLLM virtual environment. Reads a JSON list of argument lists on stdin, builds
each with `EngineArgs.add_cli_args` + `EngineArgs.from_cli_args(...).create_engine_config()`
(which constructs and validates `SpeculativeConfig`, loading the draft's config but no weights),
and prints one JSON result per line: {"ok": bool, "error": str, "speculative": {...}}.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback


def main() -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cases = json.load(sys.stdin)
    for args in cases:
        # The OpenAI server's own parser: frontend flags (--host, --port) plus EngineArgs.
        parser = make_arg_parser(FlexibleArgumentParser())
        usage_errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(usage_errors):
                namespace = parser.parse_args(args)
            engine_args = EngineArgs.from_cli_args(namespace)
            config = engine_args.create_engine_config()
            spec = config.speculative_config
            summary = None
            if spec is not None:
                summary = {
                    "method": spec.method,
                    "num_speculative_tokens": spec.num_speculative_tokens,
                    "model": spec.model,
                    "prompt_lookup_min": spec.prompt_lookup_min,
                    "prompt_lookup_max": spec.prompt_lookup_max,
                    "num_speculative_tokens_per_batch_size": (
                        spec.num_speculative_tokens_per_batch_size
                    ),
                }
            result = {"ok": True, "error": "", "speculative": summary}
        except SystemExit as exc:
            message = usage_errors.getvalue().strip().splitlines()[-1:] or [f"exit {exc.code}"]
            result = {"ok": False, "error": "argparse: " + message[0], "speculative": None}
        except Exception as exc:
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            result = {"ok": False, "error": last, "speculative": None}
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
