// Command fake-cri serves the fake remote CRI runtime of k8s.io/cri-client/pkg/fake (the
// runtime kubemark's hollow node runs) on a unix socket, for a real kubelet in the
// end-to-end suite. Sandboxes and containers exist only in its memory; no process runs.
//
// It also appends every CreateContainer request it receives to a file, one protojson
// object a line, so a test can read what the kubelet asked the runtime for: the
// environment, mounts and devices a device plugin's Allocate returned.
//
// scripts/build-control-plane.sh builds it inside its module of the pinned Kubernetes
// release, so the runtime matches the kubelet's CRI.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

// recordingRuntime is the fake runtime, with CreateContainer requests written down first.
type recordingRuntime struct {
	*fake.RemoteRuntime
	mu  sync.Mutex
	log *os.File
}

func (r *recordingRuntime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	line, err := protojson.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("fake-cri: encoding the request: %w", err)
	}
	r.mu.Lock()
	_, err = r.log.Write(append(line, '\n'))
	r.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("fake-cri: recording the request: %w", err)
	}
	return r.RemoteRuntime.CreateContainer(ctx, req)
}

func main() {
	endpoint := flag.String("endpoint", "", "unix socket to serve on, as unix:///path/to/cri.sock")
	record := flag.String("record", "", "file the CreateContainer requests are appended to (JSON lines)")
	flag.Parse()
	if *endpoint == "" || *record == "" {
		fmt.Fprintln(os.Stderr, "fake-cri: --endpoint and --record are required")
		os.Exit(2)
	}
	log, err := os.OpenFile(*record, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fake-cri: %v\n", err)
		os.Exit(1)
	}
	defer log.Close()

	// The package's own Start serves the embedded runtime, whose CreateContainer cannot be
	// wrapped; this serves the wrapper instead and reports the runtime ready as Start does.
	runtime := &recordingRuntime{RemoteRuntime: fake.NewFakeRemoteRuntime(), log: log}
	// The kubelet rejects an image without a size; every pulled image gets this nominal one.
	runtime.ImageService.SetFakeImageSize(1 << 20)
	runtime.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{
		Conditions: []*runtimeapi.RuntimeCondition{
			{Type: runtimeapi.RuntimeReady, Status: true},
			{Type: runtimeapi.NetworkReady, Status: true},
		},
	}
	listener, err := util.CreateListener(*endpoint)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fake-cri: listening on %q: %v\n", *endpoint, err)
		os.Exit(1)
	}
	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, runtime)
	runtimeapi.RegisterImageServiceServer(server, runtime)

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-signals
		server.Stop()
	}()
	fmt.Fprintf(os.Stderr, "fake-cri: serving on %s, recording to %s\n", *endpoint, *record)
	if err := server.Serve(listener); err != nil {
		fmt.Fprintf(os.Stderr, "fake-cri: %v\n", err)
		os.Exit(1)
	}
}
