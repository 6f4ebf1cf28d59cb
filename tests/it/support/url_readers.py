"""A backend that reads each request target the ways backends do, and says what it read.

What is counted is what is forwarded, by every reader: a gateway that counts `/evil/login`
while the backend serves `/login` has been walked around. Backends do not all read the target
as an origin-form path; many hand it to a URL-reference parser first (Python's `urlsplit`,
Node's `new URL(req.url, base)`, RFC 3986 section 4.2), which takes `//evil/login` for an
authority and a path `/login`, and many decode it before splitting off the query. This server
answers every request with `200` and a JSON body of those readings, so a test can check that no
reader sees a path the gateway refused.

It reads the method and the script as loose backends do too: Werkzeug, Rack and others
upper-case the method (`get` is GET) and run a GET route for HEAD; Symfony, Rails (Rack) and
Express honour `X-HTTP-Method-Override` (others `X-HTTP-Method`, `X-Method-Override`), Symfony
and Laravel a `_method` query parameter; PHP and
CGI run `/wp-login.php/x` as the script `/wp-login.php` with `PATH_INFO=/x`; Rails routes
`/search.json` to `/search`. A HEAD is answered without a body, its readings in `X-Readings`.

usage: python3 url_readers.py PORT
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urljoin, urlsplit

# Extensions of scripts servers run with the rest of the path as PATH_INFO.
SCRIPTS = {"php", "cgi", "pl", "aspx", "asmx", "jsp"}
OVERRIDES = ("x-http-method-override", "x-http-method", "x-method-override")


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
        # The methods backends read: upper-cased (GET for HEAD), and what an override names.
        method = self.command.upper()
        methods = [method, "GET" if method == "HEAD" else method]
        # As CGI, Rack and PHP name headers (HTTP_X_HTTP_METHOD_OVERRIDE): `_` is `-`.
        for name, value in self.headers.items():
            if name.lower().replace("_", "-") in OVERRIDES:
                methods += [element.strip().upper() for element in value.split(",")]
        # Symfony and Laravel read `_method` from the query of a POST too.
        methods += [value.strip().upper() for value in parse_qs(split.query).get("_method", [])]
        # PHP's SCRIPT_NAME (Apache walks to the first segment that is a file), then Rails'
        # resource: the last segment without its format.
        segments = unquote(split.path).lower().split("/")
        script = []
        for segment in segments:
            script.append(segment.split(";")[0])
            if any(ext in SCRIPTS for ext in segment.split(";")[0].split(".")[1:]):
                break
        resource = "/".join(script)
        last = resource.rsplit("/", 1)
        if "." in last[-1][1:]:
            resource = last[0] + "/" + last[-1][0] + last[-1][1:].split(".")[0]
        return {
            "methods": sorted(set(methods)),
            "script": "/".join(script),
            "resource": resource,
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
        if self.command.upper() == "HEAD":
            self.send_header("x-readings", body.decode())
        self.end_headers()
        if self.command.upper() != "HEAD":
            self.wfile.write(body)

    def __getattr__(self, name):
        # Every method, in any case (`get`, `Delete`), is answered.
        if name.startswith("do_"):
            return self.answer
        raise AttributeError(name)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Readers)
    print("ready", flush=True)
    server.serve_forever()
