"""Validate SGLang command lines in-process with SGLang's own argument definitions and checks.

Runs inside the SGLang virtual environment. Reads a JSON list of argument lists on stdin; for
each, parses with `ServerArgs.add_cli_args`, builds `ServerArgs.from_cli_args`, then runs the
speculative hook (`handle_speculative_decoding`, which from_cli_args does not run) and reads
the resolved values. Prints one `RESULT {json}` line per case.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import traceback


def main() -> None:
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.arg_groups.speculative_hook import handle_speculative_decoding
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.adaptive_spec_params import resolve_candidate_steps_from_config

    for args in json.load(sys.stdin):
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        usage_errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(usage_errors):
                namespace = parser.parse_args(args)
            server_args = ServerArgs.from_cli_args(namespace)
            handle_speculative_decoding(server_args)
            view = resolved_view(server_args)
            candidates = None
            if view.speculative_adaptive:
                candidates = resolve_candidate_steps_from_config(view.speculative_adaptive_config)
            result = {
                "ok": True,
                "error": "",
                "resolved": {
                    "algorithm": view.speculative_algorithm,
                    "draft_model_path": view.speculative_draft_model_path,
                    "num_steps": view.speculative_num_steps,
                    "eagle_topk": view.speculative_eagle_topk,
                    "num_draft_tokens": view.speculative_num_draft_tokens,
                    "adaptive": bool(view.speculative_adaptive),
                    "adaptive_candidate_steps": candidates,
                    "enable_metrics": bool(view.enable_metrics),
                },
            }
        except SystemExit as exc:
            message = usage_errors.getvalue().strip().splitlines()[-1:] or [f"exit {exc.code}"]
            result = {"ok": False, "error": "argparse: " + message[0], "resolved": None}
        except Exception as exc:
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            result = {"ok": False, "error": last, "resolved": None}
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
