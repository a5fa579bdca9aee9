#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Plays kubelet with Python's grpcio (the gRPC C core), default channel options.

usage: kubelet_grpcio.py STUBS_DIR SOCKET_DIR

Serves v1beta1.Registration on SOCKET_DIR/kubelet.sock, waits for the plugin's Register,
then dials the endpoint it named as `unix://<path>` (grpcio then sends the socket path,
percent-encoded, as the HTTP/2 :authority, as many clients do) and calls, in kubelet's
order: GetDevicePluginOptions, ListAndWatch (first list), GetPreferredAllocation (2 of
the advertised devices), Allocate (those 2), then a few requests that must be refused.
Prints one JSON object on stdout. STUBS_DIR holds api_pb2*.py made by grpc_tools.protoc.
"""
import json
import os
import queue
import sys
from concurrent import futures

import grpc
from google.protobuf import json_format

sys.path.insert(0, sys.argv[1])
import api_pb2  # noqa: E402
import api_pb2_grpc  # noqa: E402

SOCKET_DIR = sys.argv[2]
registered = queue.Queue()


class Registration(api_pb2_grpc.RegistrationServicer):
    def Register(self, request, context):
        registered.put(request)
        return api_pb2.Empty()


def refused(call, request):
    try:
        call(request, timeout=10)
    except grpc.RpcError as error:
        return {"code": error.code().name, "details": error.details()}
    return {"code": "OK"}


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_RegistrationServicer_to_server(Registration(), server)
    server.add_insecure_port("unix://" + os.path.join(SOCKET_DIR, "kubelet.sock"))
    server.start()
    request = registered.get(timeout=60)
    channel = grpc.insecure_channel("unix://" + os.path.join(SOCKET_DIR, request.endpoint))
    plugin = api_pb2_grpc.DevicePluginStub(channel)
    options = plugin.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
    stream = plugin.ListAndWatch(api_pb2.Empty(), timeout=30)
    first = next(stream)
    ids = [d.ID for d in first.devices]
    preferred = plugin.GetPreferredAllocation(
        api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=ids, allocation_size=2
                )
            ]
        ),
        timeout=10,
    )
    chosen = list(preferred.container_responses[0].deviceIDs)
    allocated = plugin.Allocate(
        api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)]
        ),
        timeout=10,
    )

    def allocate(ids):
        return api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
        )

    bad = {
        "unknown": refused(plugin.Allocate, allocate(["GPU-nope"])),
        "empty": refused(plugin.Allocate, allocate([])),
        "duplicate": refused(plugin.Allocate, allocate([ids[0], ids[0]])),
    }
    stream.cancel()
    channel.close()
    server.stop(0)
    print(
        json.dumps(
            {
                "register": json_format.MessageToDict(request, preserving_proto_field_name=True),
                "options": json_format.MessageToDict(options, preserving_proto_field_name=True),
                "devices": ids,
                "health": [d.health for d in first.devices],
                "preferred": chosen,
                "allocate": json_format.MessageToDict(
                    allocated.container_responses[0], preserving_proto_field_name=True
                ),
                "refused": bad,
            }
        )
    )


if __name__ == "__main__":
    main()
