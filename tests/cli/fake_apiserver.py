# SPDX-License-Identifier: Apache-2.0
"""A Kubernetes API server stand-in for nvshim's NodeFeature tests: HTTPS (Python's ssl,
a certificate the test made with openssl), objects kept in memory by path, every request
appended to a JSON-lines record. Not a test of ours of TLS or HTTP: an independent peer.

usage: fake_apiserver.py CERT KEY PORT_FILE RECORD_FILE TOKEN
"""

import http.server
import json
import ssl
import sys

CERT, KEY, PORT_FILE, RECORD, TOKEN = sys.argv[1:6]
COLLECTION = "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/"
objects = {}
version = [0]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def handle_any(self, method):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        with open(RECORD, "a") as record:
            record.write(json.dumps({
                "method": method,
                "path": self.path,
                "authorization": self.headers.get("Authorization"),
                "content_type": self.headers.get("Content-Type"),
                "body": body,
            }) + "\n")
        if self.headers.get("Authorization") != "Bearer " + TOKEN:
            return self.reply(401, {"kind": "Status", "code": 401, "reason": "Unauthorized"})
        if not self.path.startswith(COLLECTION):
            return self.reply(404, {"kind": "Status", "code": 404})
        if method == "GET":
            obj = objects.get(self.path)
            return self.reply(200, obj) if obj else self.reply(404, {"kind": "Status", "code": 404})
        if method == "POST":
            name = body["metadata"]["name"]
            path = self.path + "/" + name
            if path in objects:
                return self.reply(409, {"kind": "Status", "code": 409})
            version[0] += 1
            body["metadata"]["namespace"] = self.path[len(COLLECTION):].split("/")[0]
            body["metadata"]["resourceVersion"] = str(version[0])
            body["metadata"]["annotations"] = {"kept": "by updates"}
            objects[path] = body
            return self.reply(201, body)
        if method == "PUT":
            old = objects.get(self.path)
            if old is None:
                return self.reply(404, {"kind": "Status", "code": 404})
            if body["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
                return self.reply(409, {"kind": "Status", "code": 409, "reason": "Conflict"})
            version[0] += 1
            body["metadata"]["resourceVersion"] = str(version[0])
            objects[self.path] = body
            return self.reply(200, body)
        if method == "DELETE":
            if objects.pop(self.path, None) is None:
                return self.reply(404, {"kind": "Status", "code": 404})
            return self.reply(200, {"kind": "Status", "status": "Success"})
        return self.reply(405, None)

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_PUT(self):
        self.handle_any("PUT")

    def do_DELETE(self):
        self.handle_any("DELETE")


server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(CERT, KEY)
server.socket = context.wrap_socket(server.socket, server_side=True)
with open(PORT_FILE + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os
os.rename(PORT_FILE + ".tmp", PORT_FILE)
server.serve_forever()
