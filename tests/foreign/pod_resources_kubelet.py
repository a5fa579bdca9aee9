#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Plays kubelet's pod-resources server with Python's grpcio (the gRPC C core).

usage: pod_resources_kubelet.py SOCKET RESPONSE_FILE [CODE MESSAGE]

Serves v1.PodResourcesLister/List on the Unix socket SOCKET. The answer is the bytes of
RESPONSE_FILE as they are (an encoded ListPodResourcesResponse: a generic handler
without serializers), or, with CODE (a grpc.StatusCode name) and MESSAGE, that error.
Prints "ready" once serving, and stops when its stdin closes.
"""
import sys
from concurrent import futures

import grpc

socket_path, response_file = sys.argv[1], sys.argv[2]
failure = (getattr(grpc.StatusCode, sys.argv[3]), sys.argv[4]) if len(sys.argv) > 4 else None

with open(response_file, "rb") as f:
    response = f.read()


def list_pod_resources(request, context):
    if request != b"":
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "expected an empty request")
    if failure:
        context.abort(*failure)
    return response


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
