"""A fake inference server for the serving-trial harness tests: a real HTTP server process.

Takes SGLang's launch_server flags (only --port is used) and mimics what the harness relies on:
GET /health (200 after FAKE_STARTUP_S seconds), POST /generate and /v1/completions (streamed
chunks, one per requested token). It forks one child process so tests can check that the whole
process group is reaped; the pids go to $FAKE_PID_FILE. FAKE_MODE chooses a behaviour:
ok | reject (argument error, exit 2) | oom (CUDA OOM at start) | hang (never healthy) |
crash (SIGSEGV on the first request).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE = os.environ.get("FAKE_MODE", "ok")
STARTUP_S = float(os.environ.get("FAKE_STARTUP_S", "0.5"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    args, rest = p.parse_known_args()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    if os.environ.get("FAKE_PID_FILE"):
        with open(os.environ["FAKE_PID_FILE"], "w") as f:
            json.dump({"server": os.getpid(), "child": child.pid}, f)
    print("fake server args:", " ".join(sys.argv[1:]), flush=True)
    if MODE == "reject":
        print("usage: launch_server [-h] ...\nlaunch_server: error: argument --tp-size: invalid int value: 'x'", flush=True)
        sys.exit(2)
    if MODE == "oom":
        time.sleep(0.3)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        sys.exit(1)
    ready_at = time.monotonic() + STARTUP_S

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            ok = self.path == "/health" and MODE != "hang" and time.monotonic() >= ready_at
            self.send_response(200 if ok else 503)
            self.end_headers()

        def do_POST(self):
            if MODE == "crash":
                print("Fatal Python error: Segmentation fault", flush=True)
                os.kill(os.getpid(), signal.SIGSEGV)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            n = int(body.get("max_tokens") or body.get("sampling_params", {}).get("max_new_tokens") or 4)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(n):
                time.sleep(0.002)
                self.wfile.write(f"data: {json.dumps({'choices': [{'text': 't', 'index': 0}], 'i': i})}\n\n".encode())
                self.wfile.flush()
            usage = {"choices": [], "usage": {"prompt_tokens": len(body.get("prompt") or []), "completion_tokens": n}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    ThreadingHTTPServer((args.host, args.port), H).serve_forever()


if __name__ == "__main__":
    main()
