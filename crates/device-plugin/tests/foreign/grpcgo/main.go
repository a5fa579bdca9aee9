// SPDX-License-Identifier: Apache-2.0

// Command grpcgo plays a kubelet older than 1.26 with Debian's grpc-go (1.33, what
// those kubelets linked): it serves v1beta1.Registration on SOCKET_DIR/kubelet.sock,
// waits for the plugin's Register, then dials the endpoint the way kubelet 1.20's
// device manager does (the socket path as the dial target, a custom dialer: grpc-go
// sends that path as the HTTP/2 :authority) and calls GetDevicePluginOptions,
// ListAndWatch, GetPreferredAllocation (2 devices) and Allocate, then requests that
// must be refused. It prints one JSON object. Messages travel as raw protobuf bytes
// (a pass-through codec, no generated code): the test decodes the answers itself.
//
// usage: grpcgo SOCKET_DIR
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// raw passes protobuf bytes through untouched.
type raw struct{}

func (raw) Marshal(v interface{}) ([]byte, error) { return *(v.(*[]byte)), nil }
func (raw) Unmarshal(data []byte, v interface{}) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (raw) Name() string   { return "proto" }
func (raw) String() string { return "proto" }

// fields reads the length-delimited fields of a message, by number.
func fields(msg []byte) map[protowire.Number][][]byte {
	out := map[protowire.Number][][]byte{}
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			fail("bad protobuf tag")
		}
		msg = msg[n:]
		if typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(msg)
			if m < 0 {
				fail("bad protobuf bytes")
			}
			out[num] = append(out[num], v)
			msg = msg[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, msg)
		if m < 0 {
			fail("bad protobuf field")
		}
		msg = msg[m:]
	}
	return out
}

func strs(list [][]byte) []string {
	out := []string{}
	for _, b := range list {
		out = append(out, string(b))
	}
	return out
}

// containerRequest is one ContainerAllocateRequest (field 1: ids) or one
// ContainerPreferredAllocationRequest (field 1: available ids, 3: size).
func containerRequest(ids []string, size int) []byte {
	var inner []byte
	for _, id := range ids {
		inner = protowire.AppendTag(inner, 1, protowire.BytesType)
		inner = protowire.AppendString(inner, id)
	}
	if size > 0 {
		inner = protowire.AppendTag(inner, 3, protowire.VarintType)
		inner = protowire.AppendVarint(inner, uint64(size))
	}
	msg := protowire.AppendTag(nil, 1, protowire.BytesType)
	return protowire.AppendBytes(msg, inner)
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "grpcgo: "+format+"\n", args...)
	os.Exit(1)
}

type registration struct{ got chan []byte }

func (r registration) handle(srv interface{}, stream grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(stream)
	if method != "/v1beta1.Registration/Register" {
		return status.Errorf(12, "unknown method %s", method)
	}
	var req []byte
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	r.got <- req
	empty := []byte{}
	return stream.SendMsg(&empty)
}

func main() {
	if len(os.Args) != 2 {
		fail("usage: grpcgo SOCKET_DIR")
	}
	dir := os.Args[1]
	lis, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		fail("listen: %v", err)
	}
	reg := registration{got: make(chan []byte, 4)}
	server := grpc.NewServer(grpc.CustomCodec(raw{}), grpc.UnknownServiceHandler(reg.handle))
	go server.Serve(lis)
	defer server.Stop()

	var request []byte
	select {
	case request = <-reg.got:
	case <-time.After(60 * time.Second):
		fail("no Register within 60s")
	}
	r := fields(request)
	endpoint := string(r[2][0])

	// kubelet 1.20, pkg/kubelet/cm/devicemanager/endpoint.go: dial the path itself.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, filepath.Join(dir, endpoint), grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(raw{})))
	if err != nil {
		fail("dial %s: %v", endpoint, err)
	}
	defer conn.Close()
	call := func(method string, req []byte) ([]byte, error) {
		var resp []byte
		err := conn.Invoke(ctx, "/v1beta1.DevicePlugin/"+method, &req, &resp)
		return resp, err
	}
	options, err := call("GetDevicePluginOptions", []byte{})
	if err != nil {
		fail("GetDevicePluginOptions: %v", err)
	}
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/v1beta1.DevicePlugin/ListAndWatch")
	if err != nil {
		fail("ListAndWatch: %v", err)
	}
	empty := []byte{}
	if err := stream.SendMsg(&empty); err != nil {
		fail("ListAndWatch send: %v", err)
	}
	stream.CloseSend()
	var list []byte
	if err := stream.RecvMsg(&list); err != nil {
		fail("ListAndWatch receive: %v", err)
	}
	ids := []string{}
	for _, device := range fields(list)[1] {
		ids = append(ids, string(fields(device)[1][0]))
	}
	preferred, err := call("GetPreferredAllocation", containerRequest(ids, 2))
	if err != nil {
		fail("GetPreferredAllocation: %v", err)
	}
	chosen := strs(fields(fields(preferred)[1][0])[1])
	allocated, err := call("Allocate", containerRequest(chosen, 0))
	if err != nil {
		fail("Allocate: %v", err)
	}
	refused := map[string]string{}
	for name, ids := range map[string][]string{
		"unknown":   {"GPU-nope"},
		"duplicate": {ids[0], ids[0]},
	} {
		_, err := call("Allocate", containerRequest(ids, 0))
		refused[name] = status.Code(err).String() + ": " + status.Convert(err).Message()
	}
	out, _ := json.Marshal(map[string]interface{}{
		"register": map[string]string{
			"version": string(r[1][0]), "endpoint": endpoint, "resource_name": string(r[3][0]),
		},
		"options":   options,
		"devices":   ids,
		"preferred": chosen,
		"allocate":  allocated,
		"refused":   refused,
	})
	fmt.Println(string(out))
}
