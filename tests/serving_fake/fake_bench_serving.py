"""A fake `sglang.bench_serving` for the serving-trial harness tests.

Accepts the flags the SGLang backend passes, sends one real request to the server (so a dead or
crashing server shows), and writes one JSON line in bench_serving's format with canned figures
derived from the flags: duration 2.0 s, every request complete, TTFT 100 ms mean / 150 ms p90,
TPOT 20 ms mean / 25 ms p90, ITL 20 ms. FAKE_BENCH_MODE=fail exits 1 without output;
FAKE_BENCH_MODE=garbage writes a line that is not bench_serving's JSON.
"""
import argparse
import json
import os
import sys
import urllib.request


def main():
    p = argparse.ArgumentParser()
    for flag in ("--backend", "--host", "--port", "--model", "--tokenizer", "--dataset-name", "--random-input-len",
                 "--random-output-len", "--random-range-ratio", "--num-prompts", "--max-concurrency",
                 "--request-rate", "--warmup-requests", "--seed", "--output-file"):
        p.add_argument(flag, required=True)
    p.add_argument("--tokenize-prompt", action="store_true")
    p.add_argument("--disable-tqdm", action="store_true")
    a = p.parse_args()
    mode = os.environ.get("FAKE_BENCH_MODE", "ok")
    if mode == "fail":
        print("Error running benchmark", flush=True)
        sys.exit(1)
    req = urllib.request.Request(f"http://{a.host}:{a.port}/v1/completions", method="POST",
                                 data=json.dumps({"prompt": [5, 6, 7], "max_tokens": 2}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
    n, isl, osl = int(a.num_prompts), int(a.random_input_len), int(a.random_output_len)
    dur = 2.0
    res = {"backend": a.backend, "dataset_name": a.dataset_name, "max_concurrency": int(a.max_concurrency),
           "random_input_len": isl, "random_output_len": osl, "duration": dur, "completed": n,
           "total_input_tokens": n * isl, "total_output_tokens": n * osl, "request_throughput": n / dur,
           "input_throughput": n * isl / dur, "output_throughput": n * osl / dur,
           "total_throughput": n * (isl + osl) / dur,
           "mean_ttft_ms": 100.0, "median_ttft_ms": 95.0, "p90_ttft_ms": 150.0, "p99_ttft_ms": 180.0,
           "mean_tpot_ms": 20.0, "median_tpot_ms": 19.0, "p90_tpot_ms": 25.0, "p99_tpot_ms": 30.0,
           "mean_itl_ms": 20.0, "median_itl_ms": 19.5, "p90_itl_ms": 24.0, "p99_itl_ms": 40.0,
           "mean_e2e_latency_ms": 740.0, "median_e2e_latency_ms": 730.0, "p90_e2e_latency_ms": 800.0,
           "p99_e2e_latency_ms": 900.0}
    with open(a.output_file, "a") as f:
        f.write(("not json\n" if mode == "garbage" else json.dumps(res) + "\n"))


if __name__ == "__main__":
    main()
