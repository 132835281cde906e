"""With --prometheus-url the topic series come from Prometheus range queries (here a stand-in that
records the queries and answers in Prometheus's JSON), not from the embedded history."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support.broker import running_broker
from tests.support.gateway import running_gateway


class _Prometheus(BaseHTTPRequestHandler):
    queries: list = []

    def do_GET(self):  # noqa: N802 - http.server's name
        url = urllib.parse.urlparse(self.path)
        q = urllib.parse.parse_qs(url.query)
        self.queries.append((url.path, q))
        start, step = int(q["start"][0]), float(q["step"][0])
        values = [[start + i * step, str(float(i))] for i in range(3)]
        body = json.dumps(
            {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": values}]}}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_series_from_prometheus(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with running_broker(data_dir=str(tmp_path)) as broker:
            with running_gateway(
                broker.admin_port, str(tmp_path), "--prometheus-url", f"http://127.0.0.1:{server.server_port}"
            ) as gw:
                now = int(time.time())
                doc = gw.get(f"/ui/v1/topics/%2Fdefault%2Fpaid/series?from={now - 300}&to={now}&step=30s")
    finally:
        server.shutdown()
        server.server_close()
    assert doc["source"] == "prometheus" and doc["errors"] == []
    series = {s["name"]: s["points"] for s in doc["series"]}
    assert series["publish_rate_1m"] == [[now - 300, 0.0], [now - 270, 1.0], [now - 240, 2.0]]
    paths = {p for p, _ in _Prometheus.queries}
    assert paths == {"/api/v1/query_range"}
    queries = [q["query"][0] for _, q in _Prometheus.queries]
    assert 'sum(rate(danube_topic_messages_in_total{topic="/default/paid"}[1m]))' in queries
    assert all(q["step"] == ["30.0"] for _, q in _Prometheus.queries)
