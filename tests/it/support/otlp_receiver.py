#!/usr/bin/env python3
"""An OTLP trace receiver for the tests, built on the OpenTelemetry project's own messages
(the `opentelemetry-proto` package): nothing here decodes protobuf by hand.

    otlp_receiver.py http PORT    POST /v1/traces, OTLP/HTTP with binary protobuf
    otlp_receiver.py grpc PORT    opentelemetry.proto.collector.trace.v1.TraceService/Export

Each span received is printed as one JSON line on stdout, flushed at once:
{"service": ..., "resource": {...}, "name": ..., "kind": ..., "trace_id": hex, "span_id": hex,
 "parent_span_id": hex or "", "status": code, "start_ns": ..., "end_ns": ...,
 "attributes": {key: value}}
"""

import json
import sys
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def value_of(any_value):
    """An AnyValue as a plain Python value."""
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value_of(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value_of(kv.value) for kv in any_value.kvlist_value.values}
    if kind == "bytes_value":
        return any_value.bytes_value.hex()
    return getattr(any_value, kind)


def print_spans(request):
    """Each span of an ExportTraceServiceRequest, one JSON line each."""
    for resource_spans in request.resource_spans:
        resource = {kv.key: value_of(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                line = {
                    "service": resource.get("service.name"),
                    "resource": resource,
                    "scope": scope_spans.scope.name,
                    "name": span.name,
                    "kind": span.kind,
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "trace_state": span.trace_state,
                    "status": span.status.code,
                    "start_ns": span.start_time_unix_nano,
                    "end_ns": span.end_time_unix_nano,
                    "attributes": {kv.key: value_of(kv.value) for kv in span.attributes},
                }
                sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


class HttpReceiver(BaseHTTPRequestHandler):
    def do_POST(self):
        if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
            self.send_response(404)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        print_spans(request)
        reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


class GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        print_spans(request)
        return trace_service_pb2.ExportTraceServiceResponse()


def main():
    protocol, port = sys.argv[1], int(sys.argv[2])
    if protocol == "http":
        ThreadingHTTPServer(("127.0.0.1", port), HttpReceiver).serve_forever()
    elif protocol == "grpc":
        import grpc

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(GrpcReceiver(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        server.wait_for_termination()
    else:
        sys.exit(f"usage: {sys.argv[0]} http|grpc PORT")


if __name__ == "__main__":
    main()
