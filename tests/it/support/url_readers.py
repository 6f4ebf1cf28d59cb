"""A backend that reads each request target the ways backends do, and says what it read.

What is counted is what is forwarded, by every reader: a gateway that counts `/evil/login`
while the backend serves `/login` has been walked around. Backends do not all read the target
as an origin-form path; many hand it to a URL-reference parser first (Python's `urlsplit`,
Node's `new URL(req.url, base)`, RFC 3986 section 4.2), which takes `//evil/login` for an
authority and a path `/login`, and many decode it before splitting off the query. This server
answers every request with `200` and a JSON body of those readings, so a test can check that no
reader sees a path the gateway refused.

usage: python3 url_readers.py PORT
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urljoin, urlsplit


class Readers(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def readings(self):
        # The target as sent: http.server itself merges a leading `//` in `self.path` (a fix
        # of its own for this very confusion), which other servers do not.
        raw = self.requestline.split(" ")[1]
        split = urlsplit(raw)
        # A WHATWG-like reading: resolved against the backend's own base URL.
        joined = urlsplit(urljoin("http://backend.test/", raw))
        # A server that decodes first, then splits off the query and fragment.
        decoded = urlsplit(unquote(raw))
        return {
            "raw": raw,
            "urlsplit": split.path,
            "urlsplit_netloc": split.netloc,
            "urljoin": joined.path,
            "urljoin_netloc": joined.netloc,
            "decoded": decoded.path,
            "decoded_netloc": decoded.netloc,
        }

    def answer(self):
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        body = json.dumps(self.readings()).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = answer

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Readers)
    print("ready", flush=True)
    server.serve_forever()
