"""A real OTLP receiver on 127.0.0.1 (gRPC and HTTP/protobuf), for tests and benchmarks.

Built on the ``opentelemetry-proto`` service definitions: it decodes what an
exporter really sent and keeps it, so a test asserts on names, attributes and
values the way a Collector would see them.

    with OtlpReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint}
        ...
        receiver.spans(), receiver.metric_points("spectrace.verify.accepted_tokens")
"""

from __future__ import annotations

import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def _value(any_value) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
    return getattr(any_value, kind) if kind else None


def attributes(kvs) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class OtlpReceiver:
    def __init__(self, *, grpc_port: int = 0, http_port: int = 0) -> None:
        self.trace_requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metric_requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.http_paths: list[str] = []
        self._lock = threading.Lock()
        self._grpc_port = grpc_port
        self._http_port = http_port
        self._grpc = None
        self._http = None

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> "OtlpReceiver":
        receiver = self

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                with receiver._lock:
                    receiver.trace_requests.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):
                with receiver._lock:
                    receiver.metric_requests.append(request)
                return metrics_service_pb2.ExportMetricsServiceResponse()

        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self._grpc)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self._grpc)
        self.grpc_port = self._grpc.add_insecure_port(f"127.0.0.1:{self._grpc_port}")
        self._grpc.start()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/v1/traces":
                    message = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                    with receiver._lock:
                        receiver.trace_requests.append(message)
                        receiver.http_paths.append(self.path)
                    reply = trace_service_pb2.ExportTraceServiceResponse()
                elif self.path == "/v1/metrics":
                    message = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                    with receiver._lock:
                        receiver.metric_requests.append(message)
                        receiver.http_paths.append(self.path)
                    reply = metrics_service_pb2.ExportMetricsServiceResponse()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                payload = reply.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", self._http_port), Handler)
        self.http_port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace=None)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()

    def __enter__(self) -> "OtlpReceiver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    # -- what arrived --------------------------------------------------------------

    def spans(self) -> list[dict[str, Any]]:
        out = []
        with self._lock:
            requests = list(self.trace_requests)
        for request in requests:
            for resource_spans in request.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        out.append(
                            {
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_span_id": span.parent_span_id.hex(),
                                "attributes": attributes(span.attributes),
                                "events": [(e.name, attributes(e.attributes)) for e in span.events],
                                "resource": resource,
                            }
                        )
        return out

    def metric_points(self, name: str) -> list[dict[str, Any]]:
        """Every data point received for metric ``name`` (cumulative: later points supersede)."""
        out = []
        with self._lock:
            requests = list(self.metric_requests)
        for request in requests:
            for resource_metrics in request.resource_metrics:
                resource = attributes(resource_metrics.resource.attributes)
                for scope in resource_metrics.scope_metrics:
                    for metric in scope.metrics:
                        if metric.name != name:
                            continue
                        data = getattr(metric, metric.WhichOneof("data"))
                        for point in data.data_points:
                            if "as_int" in point.DESCRIPTOR.fields_by_name:
                                value = point.as_int if point.HasField("as_int") else point.as_double
                            else:  # histogram
                                value = {
                                    "count": point.count,
                                    "sum": point.sum,
                                    "bucket_counts": list(point.bucket_counts),
                                    "explicit_bounds": list(point.explicit_bounds),
                                }
                            out.append(
                                {
                                    "attributes": attributes(point.attributes),
                                    "value": value,
                                    "time": point.time_unix_nano,
                                    "resource": resource,
                                }
                            )
        return out

    def latest(self, name: str, key: tuple[str, ...]) -> dict[tuple, float]:
        """The last value of each series of ``name``, keyed by the attributes in ``key``."""
        latest: dict[tuple, tuple[int, float]] = {}
        for point in self.metric_points(name):
            k = tuple(point["attributes"].get(a) for a in key)
            if k not in latest or point["time"] >= latest[k][0]:
                latest[k] = (point["time"], point["value"])
        return {k: v for k, (_, v) in latest.items()}
