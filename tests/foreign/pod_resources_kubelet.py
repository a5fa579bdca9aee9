#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Plays kubelet's pod-resources server with Python's grpcio (the gRPC C core).

usage: pod_resources_kubelet.py SOCKET RESPONSE_FILE

Serves v1.PodResourcesLister/List on the Unix socket SOCKET. Each call answers with the
bytes of RESPONSE_FILE as they are then (an encoded ListPodResourcesResponse: a generic
handler without serializers), or, while RESPONSE_FILE.fail exists, fails with the status
it names: a grpc.StatusCode name on its first line, the message on the second. Prints
"ready" once serving, and stops when its stdin closes.
"""
import os
import sys
from concurrent import futures

import grpc

socket_path, response_file = sys.argv[1], sys.argv[2]


def list_pod_resources(request, context):
    if request != b"":
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "expected an empty request")
    if os.path.exists(response_file + ".fail"):
        with open(response_file + ".fail", encoding="utf-8") as f:
            code, message = f.read().split("\n", 1)
        context.abort(getattr(grpc.StatusCode, code), message)
    with open(response_file, "rb") as f:
        return f.read()


handler = grpc.method_handlers_generic_handler(
    "v1.PodResourcesLister",
    {"List": grpc.unary_unary_rpc_method_handler(list_pod_resources)},
)
server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
server.add_generic_rpc_handlers((handler,))
server.add_insecure_port("unix:" + socket_path)
server.start()
print("ready", flush=True)
sys.stdin.read()
server.stop(None)
