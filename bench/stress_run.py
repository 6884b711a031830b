"""The timing-sensitive tests under CPU stress: `stress-ng --cpu N` beside pytest, results kept.

    .venv/bin/python bench/stress_run.py     # tests/e2e tests/operator tests/integration
    .venv/bin/python bench/stress_run.py --label run-2 -- tests/e2e

Starts `stress-ng --cpu N` (Debian's stress-ng; N = 2 by default, one hog per core of this
host), runs `pytest -q` on the given paths with a junit report, stops the stress, and appends
to `bench/results/stress.json` and `.md`: the commit, the exact commands, the duration, the
pass / fail / skip / error counts, the slowest tests, every failure's first lines, and the
host's load average sampled every 10 s (other work on a shared host shows there too). Test
files git does not track (another session's work in progress) are left out with `--ignore`,
and named. Bounded: pytest gets `--timeout-s` (default 3600 s) and is killed past it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import threading
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
Obj = dict[str, Any]
DEFAULT_PATHS = ["tests/e2e", "tests/operator", "tests/integration"]
MAKE_TEST_ENV = ("SPECPILOT_IMAGE_BUILD",)
"""Variables `make test` sets for pytest; recorded with the command when given."""


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def untracked_tests(paths: Sequence[str]) -> list[str]:
    listed = git("ls-files", "--others", "--exclude-standard", "--", *paths)
    return sorted(p for p in listed.splitlines() if p.endswith(".py"))


def junit_counts(path: Path) -> Obj:
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    cases = [case for suite in suites for case in suite.iter("testcase")]
    failures, skipped, slowest = [], 0, []
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        slowest.append((float(case.get("time") or 0.0), name))
        for tag in ("failure", "error"):
            found = case.find(tag)
            if found is not None:
                text = (found.get("message") or found.text or "").strip().splitlines()
                failures.append({"test": name, "kind": tag, "message": " ".join(text[:3])[:400]})
        if case.find("skipped") is not None:
            skipped += 1
    failed = {f["test"] for f in failures}
    return {
        "tests": len(cases),
        "passed": len(cases) - len(failed) - skipped,
        "failed": len(failed),
        "skipped": skipped,
        "failures": failures,
        "slowest": [{"test": n, "s": round(t, 1)} for t, n in sorted(slowest, reverse=True)[:8]],
    }


def progress_counts(output: str) -> Obj:
    """What `pytest -v` output cut off at a timeout tells (no junit report is written then):
    the outcomes its last lines show and the test that was running."""
    lines = [line for line in output.splitlines() if "::" in line]
    outcomes = [line.split()[1] for line in lines if len(line.split()) > 1]
    running = lines[-1].split()[0] if lines and len(lines[-1].split()) == 1 else None
    return {
        "tests": 0,
        "outcomes_before_timeout": {o: outcomes.count(o) for o in sorted(set(outcomes))},
        "running_at_timeout": running,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="run")
    parser.add_argument("--cpu", type=int, default=2, help="stress-ng --cpu workers")
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/stress.json")
    parser.add_argument("--md", type=Path, default=REPO / "bench/results/stress.md")
    parser.add_argument("paths", nargs="*", default=DEFAULT_PATHS)
    args = parser.parse_args(argv)
    ignored = untracked_tests(args.paths)
    junit = Path(f"/tmp/stress-{os.getpid()}.xml")
    pytest_command = [
        # -v names each test as it starts: a run killed at its timeout says where it was
        ".venv/bin/python", "-m", "pytest", "-v", "-p", "no:cacheprovider",
        f"--junitxml={junit}", *(f"--ignore={p}" for p in ignored), *args.paths,
    ]  # fmt: skip
    stress_command = ["stress-ng", "--cpu", str(args.cpu), "--timeout", f"{int(args.timeout_s)}s"]
    loads: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(10.0):
            loads.append(os.getloadavg()[0])

    started_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    commit = git("rev-parse", "HEAD")  # what pytest collected; later commits are named apart
    load_before = os.getloadavg()
    stress = subprocess.Popen(stress_command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    threading.Thread(target=sample, daemon=True).start()
    began = time.monotonic()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    # as `make test` sets it: the image build test must run, not skip
    recorded_env = {"HF_HUB_OFFLINE": "1", **{k: env[k] for k in MAKE_TEST_ENV if k in env}}
    try:
        test = subprocess.run(
            pytest_command, cwd=REPO, env=env, capture_output=True, text=True,
            timeout=args.timeout_s, check=False,
        )  # fmt: skip
        rc, output = test.returncode, test.stdout + test.stderr
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        rc, output = 124, (partial or "") + "\n" + str(exc)
    finally:
        duration = time.monotonic() - began
        done.set()
        stress.send_signal(signal.SIGTERM)
        stress.wait(30)
    result: Obj = {
        "label": args.label,
        "commit": commit,
        "commits_during_run": git("log", "--format=%h", f"{commit}..HEAD").split(),
        "dirty_tracked_paths": len(
            git("status", "--porcelain", "--untracked-files=no").splitlines()
        ),
        "started_utc": started_utc,
        "stress_command": shlex.join(stress_command),
        "pytest_command": " ".join(f"{k}={v}" for k, v in recorded_env.items())
        + " "
        + shlex.join(pytest_command),
        "ignored_untracked": ignored,
        "exit_status": rc,
        "duration_s": round(duration, 1),
        "load_average_before": [round(x, 2) for x in load_before],
        "load1_during": {
            "mean": round(statistics.fmean(loads), 2) if loads else None,
            "max": round(max(loads), 2) if loads else None,
            "samples": len(loads),
        },
        **(junit_counts(junit) if junit.exists() else progress_counts(output)),
        "pytest_tail": output[-3000:].splitlines()[-5:],
    }
    report: Obj = json.loads(args.out.read_text()) if args.out.exists() else {"runs": []}
    report["runs"].append(result)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    args.md.write_text(markdown(report))
    print(json.dumps({k: result.get(k) for k in ("label", "duration_s", "passed", "failed")}))
    return 0 if rc == 0 else 1


def markdown(report: Obj) -> str:
    lines = [
        "# The timing-sensitive tests under CPU stress",
        "",
        "Written by `bench/stress_run.py` (its docstring is the method): `stress-ng --cpu 2` "
        "(one CPU hog per core of this 2-core host) beside pytest. The host was shared with "
        "other sessions' work as well: the load averages say how busy it was.",
        "",
        "| run | commit | started (UTC) | duration | tests | passed | failed | skipped | "
        "load1 before / mean / max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in report["runs"]:
        during = run.get("load1_during", {})
        lines.append(
            f"| {run['label']} | `{run['commit'][:7]}` | {run['started_utc']} | "
            f"{run['duration_s']:.0f} s | {run.get('tests')} | {run.get('passed')} | "
            f"{run.get('failed')} | {run.get('skipped')} | {run['load_average_before'][0]} / "
            f"{during.get('mean')} / {during.get('max')} |"
        )
    lines += ["", *report.get("notes", [])]
    for run in report["runs"]:
        lines += ["", f"## {run['label']}", "", f"- stress: `{run['stress_command']}`",
                  f"- tests: `{run['pytest_command']}`",
                  f"- tracked paths modified at the time: {run['dirty_tracked_paths']}; "
                  f"untracked test files left out: {', '.join(run['ignored_untracked']) or 'none'}",
                  f"- exit status {run['exit_status']}; slowest: "
                  + ", ".join(f"{s['test'].split('.')[-1]} {s['s']} s"
                              for s in run.get("slowest", [])[:5])]  # fmt: skip
        for failure in run.get("failures", []):
            lines.append(f"- FAILED `{failure['test']}`: {failure['message']}")
        if "running_at_timeout" in run:
            lines.append(
                f"- killed at the timeout while `{run['running_at_timeout']}` ran; outcomes "
                f"before it: {run.get('outcomes_before_timeout')}"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
