"""Does reporting progress to the TrainJob's status slow training? The same job with no endpoint, and with
an endpoint that never answers (the worst case: every request waits for its timeout), side by side.

    python bench/progress_overhead.py --repeats 3 --record lab/benchmarks/results.jsonl

The runs alternate (none, stalled, none, stalled, ...) so both see the same machine state; the figure is
each side's training-loop seconds (``train_seconds`` in metrics.json), log_every 1 so a report is due
after every step.
"""

from __future__ import annotations

import argparse
import http.server
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, git_commit, minilm, output_arguments, quickstart_data, run_colbert_train, write_result


class _Stall(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        time.sleep(3600)

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    output_arguments(parser, "progress-overhead")
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stall)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stalled = {"KUBEFLOW_TRAINER_SERVER_URL": f"http://127.0.0.1:{server.server_address[1]}/status"}
    data = quickstart_data(ROOT / "data" / "quickstart")
    config = {
        "model": {"name_or_path": minilm(), "query_length": 32, "document_length": 128},
        "data": {"train": {"path": str(data)}},
        "training": {"per_device_batch_size": 8, "max_steps": args.steps, "log_every": 1},
        "checkpoint": {"every_steps": 1000},
        "evaluation": {"after_training": False},
    }
    seconds: dict[str, list[float]] = {"no endpoint": [], "stalled endpoint": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for side, env in (("no endpoint", None), ("stalled endpoint", stalled)):
                m = run_colbert_train(Path(tmp) / f"{side}-{r}".replace(" ", "-"), 1, config, env)
                seconds[side].append(m["train_seconds"])
                print(f"repeat {r} {side}: {m['train_seconds']:.2f} s in the loop", flush=True)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    result = {
        "commit": git_commit(),
        "steps": args.steps,
        "seconds": seconds,
        "median": med,
        "ratio": med["stalled endpoint"] / med["no endpoint"],
    }
    write_result(result, args)
    print(
        f"median loop seconds: none {med['no endpoint']:.2f}, stalled {med['stalled endpoint']:.2f}, "
        f"ratio {result['ratio']:.3f}"
    )


if __name__ == "__main__":
    main()
