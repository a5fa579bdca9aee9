#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Raw HTTP/2 requests to a gRPC server on a Unix socket, framed and HPACK-coded by
python-hyper's `h2` and `hpack`, to try every way a client may send `:authority`.

usage: h2_raw.py SOCKET

Each case opens one connection and sends the same gRPC call
(`/v1beta1.DevicePlugin/GetDevicePluginOptions`, an empty message) several times with a
given :authority and framing. Prints one JSON line per case: the grpc-status of each
response, or the error that ended the connection.
"""
import json
import socket
import sys

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import hyperframe.frame

SOCKET = sys.argv[1]
PATH = "/v1beta1.DevicePlugin/GetDevicePluginOptions"
BODY = b"\x00\x00\x00\x00\x00"  # an uncompressed, empty gRPC message


def headers(authority, order="grpc-go"):
    pseudo = [(":method", "POST"), (":scheme", "http"), (":path", PATH)]
    if authority is not None:
        if order == "grpc-go":  # :authority last of the pseudo-headers
            pseudo.append((":authority", authority))
        else:  # grpcio: right after :path, before :method
            pseudo.insert(0, (":authority", authority))
    return pseudo + [
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("user-agent", "nvshim-h2-raw"),
    ]


def crafted(call):
    """A hand-made block adding an *empty* :authority to the table (no encoder we know
    does this, but HPACK allows it), then later calls referring to it by index."""
    if call == 0:
        block = bytearray(b"\x83\x86")                      # POST, http
        block += b"\x44" + bytes([len(PATH)]) + PATH.encode()  # :path, added (64 later)
        block += b"\x41\x00"                                 # :authority "", added (63)
        block += b"\x5f\x10application/grpc"                 # content-type, added (62)
    else:
        block = bytearray(b"\x83\x86\xc0\xbf\xbe")          # the same, by index
    block += b"\x00\x02te\x08trailers"                      # te, not added
    return bytes(block)


def reframe(data, pad=0, split=0, block=None):
    """Rewrites the HEADERS frame in `data`: padding, a new block, or split over
    CONTINUATION frames of `split` bytes."""
    out = b""
    at = 0
    while at < len(data):
        frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(data[at:at + 9]))
        frame.parse_body(memoryview(data[at + 9:at + 9 + length]))
        at += 9 + length
        if not isinstance(frame, hyperframe.frame.HeadersFrame):
            out += frame.serialize()
            continue
        if block is not None:
            frame.data = block
        if pad:
            frame.flags.add("PADDED")
            frame.pad_length = pad
        if split and len(frame.data) > split:
            rest = frame.data[split:]
            frame.data = frame.data[:split]
            frame.flags.discard("END_HEADERS")
            out += frame.serialize()
            while rest:
                cont = hyperframe.frame.ContinuationFrame(frame.stream_id, rest[:split])
                rest = rest[split:]
                if not rest:
                    cont.flags.add("END_HEADERS")
                out += cont.serialize()
            continue
        out += frame.serialize()
    return out


def run_case(name, authority, calls=3, order="grpc-go", huffman=True, pad=0,
             priority=False, big_header=0, sensitive=False, table_size=None, split=0,
             craft=False):
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(10)
    sock.connect(SOCKET)
    config = h2.config.H2Configuration(
        client_side=True, validate_outbound_headers=False,
        normalize_outbound_headers=False, header_encoding=None)
    conn = h2.connection.H2Connection(config=config)
    conn.encoder.huffman = huffman
    if table_size is not None:
        conn.encoder.header_table_size = table_size
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    statuses = []
    error = None
    try:
        for call in range(calls):
            stream = conn.get_next_available_stream_id()
            hs = headers(authority, order)
            if big_header:
                # Forces the block over one 16 KiB frame: HEADERS + CONTINUATION.
                hs.append(("x-filler", "f" * big_header))
            if sensitive:
                hs = [hpack.NeverIndexedHeaderTuple(n, v) if n == ":authority" else (n, v)
                      for n, v in hs]
            kwargs = {}
            if priority:
                kwargs.update(priority_weight=200, priority_depends_on=0,
                              priority_exclusive=False)
            conn.send_headers(stream, hs, end_stream=False, **kwargs)
            data = conn.data_to_send()
            if pad or split or craft:
                data = reframe(data, pad=pad, split=split, block=crafted(call) if craft else None)
            conn.send_data(stream, BODY, end_stream=True)
            sock.sendall(data + conn.data_to_send())
            statuses.append(wait_for(conn, sock, stream))
    except Exception as e:  # the connection ended: report it
        error = f"{type(e).__name__}: {e}"
    sock.close()
    return {"case": name, "statuses": statuses, "error": error}


def wait_for(conn, sock, stream):
    """The grpc-status the server answered `stream` with, or how it refused it."""
    status = None
    while True:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("server closed the connection")
        for event in conn.receive_data(data):
            if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)) \
                    and event.stream_id == stream:
                for key, value in event.headers:
                    if key == b"grpc-status":
                        status = int(value)
            if isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                sock.sendall(conn.data_to_send())
                return status
            if isinstance(event, h2.events.StreamReset) and event.stream_id == stream:
                return f"RST_STREAM {event.error_code!r}"
            if isinstance(event, h2.events.ConnectionTerminated):
                raise ConnectionError(f"GOAWAY {event.error_code!r}")
        sock.sendall(conn.data_to_send())


CASES = [
    ("socket path", dict(authority=SOCKET)),
    ("socket path, raw strings", dict(authority=SOCKET, huffman=False)),
    ("percent-encoded path, grpcio order", dict(authority=SOCKET.lstrip("/").replace("/", "%2F"), order="grpcio")),
    ("empty, grpc-go order", dict(authority="")),
    ("empty, grpcio order", dict(authority="", order="grpcio")),
    ("empty, never indexed", dict(authority="", sensitive=True)),
    ("path, never indexed", dict(authority=SOCKET, sensitive=True)),
    ("localhost", dict(authority="localhost")),
    ("[::]:port", dict(authority="[::]:50051")),
    ("no authority", dict(authority=None)),
    ("padded, priority", dict(authority=SOCKET, pad=7, priority=True)),
    ("continuation (large block)", dict(authority=SOCKET, big_header=15000)),
    ("continuation (16-byte frames), padded", dict(authority=SOCKET, split=16, pad=2)),
    ("empty, added to the table, then indexed", dict(authority="", craft=True)),
    ("small table, many calls", dict(authority=SOCKET, calls=40, table_size=256)),
]

if __name__ == "__main__":
    for name, kwargs in CASES:
        print(json.dumps(run_case(name, **kwargs)), flush=True)
