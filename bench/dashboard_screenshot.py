"""Screenshot of Ray's dashboard during a tuning study, taken with headless Chromium.

Starts `moetune tune ... --dashboard` (a real cpu-local study, token authentication on), reads the
dashboard address it logs, and, while trials run, points Debian's `chromium` (--headless
--screenshot) at the dashboard's Actors page through a loopback proxy that adds the study's Ray
token to every request (the dashboard refuses requests without it; a browser would otherwise send
it as the cookie `/api/authenticate` sets). The PNG goes to bench/results/.

  python bench/dashboard_screenshot.py [--out bench/results/ray_dashboard_tune.png] [--page actors]

Needs `chromium` (apt-get install chromium) and the megatron extra.
"""
from __future__ import annotations

import argparse
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _proxy(upstream: str, token: str) -> http.server.ThreadingHTTPServer:
    """A 127.0.0.1 proxy to the dashboard adding `Authorization: Bearer <token>`."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            req = urllib.request.Request(upstream + self.path, headers={"Authorization": f"Bearer {token}"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    body, status, ctype = r.read(), r.status, r.headers.get("Content-Type", "")
            except urllib.error.HTTPError as e:
                body, status, ctype = e.read(), e.code, e.headers.get("Content-Type", "")
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench/results/ray_dashboard_tune.png"))
    ap.add_argument("--page", default="actors", help="dashboard page: actors, jobs, overview, metrics")
    ap.add_argument("--wait-s", type=float, default=20.0, help="seconds after the first trial starts")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("chromium not found: apt-get install -y chromium", file=sys.stderr)
        return 2
    from trials.ray_runtime import ensure_token
    token = ensure_token().read_text().strip()
    work = Path(tempfile.mkdtemp(prefix="moetune-dash-"))
    cmd = [sys.executable, "-m", "tuner.cli", "tune", "--model", "tiny-moe", "--cluster", "cpu-local", "--gpus", "2",
           "--gbs", "8", "--seq", "64", "--study", "dashboard", "--study-dir", str(work / "study"), "--trials", "2",
           "--dashboard", "--no-progress"]
    tune = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    url, lines = None, []
    try:
        for line in tune.stdout:  # the dashboard's address, then the first trial's launch
            lines.append(line)
            m = re.search(r"Ray dashboard: (http://\S+)", line)
            url = url or (m.group(1) if m else None)
            if url and ("pre-registered" in line or "resuming" in line):
                break
        if not url:
            print("the study logged no dashboard address:\n" + "".join(lines[-20:]), file=sys.stderr)
            return 1
        time.sleep(args.wait_s)
        srv = _proxy(url, token)
        page = f"http://127.0.0.1:{srv.server_address[1]}/#/{args.page}"
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shot = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={work / 'chromium'}", "--window-size=1600,1000", "--virtual-time-budget=15000",
             f"--screenshot={out}", page], capture_output=True, text=True, timeout=300)
        srv.shutdown()
        if not out.exists():
            print(f"chromium wrote no screenshot: {shot.stderr[-2000:]}", file=sys.stderr)
            return 1
        print(f"dashboard {url} page {args.page}: {out} ({out.stat().st_size} bytes)")
        return 0
    finally:
        tune.terminate()
        try:
            tune.wait(timeout=60)
        except subprocess.TimeoutExpired:
            tune.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
