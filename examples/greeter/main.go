// Command greeter is a small proxyless gRPC workload (docs/dataplane.md):
// a Greeter server and a client, both configured by the zone over xDS
// through the bootstrap meridian-dp writes (GRPC_XDS_BOOTSTRAP). Run them
// under meridian-dp:
//
//	meridian-dp run ... -- greeter serve --listen 127.0.0.1:9090
//	meridian-dp run ... -- greeter call --service greeter --every 500ms
//
// The server can misbehave on purpose, to show what policies do about it:
// --delay answers late, --fail-first N fails the first N attempts of each
// call with Unavailable (the attempts of one call share its request name),
// --fail fails every call. The client prints one line per call, with its
// duration.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/xds"

	greeterv1 "github.com/meridian-mesh/meridian/proto/meridian/greeter/v1"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: greeter serve --listen ADDR:PORT | greeter call --service NAME [--every D] [--count N]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(ctx, os.Args[2:])
	case "call":
		err = call(ctx, os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "greeter:", err)
		os.Exit(1)
	}
}

// serve runs the Greeter on an xDS-managed server: the zone sends its
// TLS and authorization (RBAC) for the listening address.
func serve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := fs.String("listen", "", "address to listen on: the Dataplane inbound's address and port")
	delay := fs.Duration("delay", 0, "answer each call this late")
	failFirst := fs.Int("fail-first", 0, "fail the first N attempts of each call (by request name) with Unavailable")
	fail := fs.Bool("fail", false, "fail every call with Unavailable")
	_ = fs.Parse(args)
	if *listen == "" {
		return errors.New("--listen is required")
	}
	creds, err := xdscreds.NewServerCredentials(xdscreds.ServerOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		return err
	}
	srv, err := xds.NewGRPCServer(grpc.Creds(creds), xds.ServingModeCallback(func(addr net.Addr, args xds.ServingModeChangeArgs) {
		fmt.Fprintf(os.Stderr, "greeter: serving mode of %s: %s %v\n", addr, args.Mode, args.Err)
	}))
	if err != nil {
		return err
	}
	greeterv1.RegisterGreeterServiceServer(srv, &greeter{zone: os.Getenv("MERIDIAN_ZONE"), instance: os.Getenv("MERIDIAN_NODE_ID"),
		delay: *delay, failFirst: *failFirst, fail: *fail, attempts: map[string]int{}})
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	fmt.Fprintf(os.Stderr, "greeter: listening on %s\n", lis.Addr())
	return srv.Serve(lis)
}

type greeter struct {
	greeterv1.UnimplementedGreeterServiceServer
	zone, instance string
	delay          time.Duration
	failFirst      int
	fail           bool

	mu       sync.Mutex
	attempts map[string]int // by request name
}

// SayHello answers, after --delay, unless told to fail. Each attempt is
// printed: "attempt NAME K".
func (g *greeter) SayHello(ctx context.Context, req *greeterv1.SayHelloRequest) (*greeterv1.SayHelloResponse, error) {
	g.mu.Lock()
	g.attempts[req.GetName()]++
	n := g.attempts[req.GetName()]
	g.mu.Unlock()
	fmt.Printf("attempt %s %d\n", req.GetName(), n)
	if g.fail || n <= g.failFirst {
		return nil, status.Errorf(codes.Unavailable, "attempt %d of %s fails on purpose", n, req.GetName())
	}
	if g.delay > 0 {
		select {
		case <-time.After(g.delay):
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	return &greeterv1.SayHelloResponse{Message: "hello " + req.GetName(), Zone: g.zone, Instance: g.instance}, nil
}

// call calls the Greeter service through xds:///SERVICE, once or every
// interval, printing one line per call: ok ZONE INSTANCE, or the error.
func call(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("call", flag.ExitOnError)
	service := fs.String("service", "greeter", "the service to call (xds:///SERVICE)")
	every := fs.Duration("every", 0, "call every interval until stopped (0: once)")
	count := fs.Int("count", 0, "with --every, stop after this many calls (0: never)")
	timeout := fs.Duration("timeout", 2*time.Second, "each call's deadline")
	parallel := fs.Int("parallel", 1, "calls made at once each time")
	var headers headerFlags
	fs.Var(&headers, "header", "a request header KEY=VALUE (repeatable)")
	_ = fs.Parse(args)
	creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient("xds:///"+*service, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := greeterv1.NewGreeterServiceClient(conn)
	var last error
	for n := 1; ; n++ {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for i := range max(*parallel, 1) {
			wg.Go(func() {
				name := fmt.Sprintf("call-%d", n)
				if *parallel > 1 {
					name = fmt.Sprintf("call-%d.%d", n, i)
				}
				err := callOnce(ctx, client, name, *timeout, headers)
				mu.Lock()
				last = err
				mu.Unlock()
			})
		}
		wg.Wait()
		if *every == 0 || (*count > 0 && n >= *count) {
			return last
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*every):
		}
	}
}

// callOnce makes one call and prints its line: "ok ZONE INSTANCE MESSAGE
// in D" or "error CODE: MESSAGE in D".
func callOnce(ctx context.Context, client greeterv1.GreeterServiceClient, name string, timeout time.Duration, headers headerFlags) error {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if len(headers) > 0 {
		cctx = metadata.AppendToOutgoingContext(cctx, headers...)
	}
	start := time.Now()
	resp, err := client.SayHello(cctx, &greeterv1.SayHelloRequest{Name: name})
	took := time.Since(start).Round(time.Millisecond)
	if err != nil {
		st := status.Convert(err)
		fmt.Printf("error %s: %s in %s\n", st.Code(), st.Message(), took)
		return err
	}
	fmt.Printf("ok %s %s %s in %s\n", resp.GetZone(), resp.GetInstance(), resp.GetMessage(), took)
	return nil
}

// headerFlags are --header KEY=VALUE flags as metadata pairs.
type headerFlags []string

func (h *headerFlags) String() string { return strings.Join(*h, ",") }

func (h *headerFlags) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	*h = append(*h, strings.ToLower(k), val)
	return nil
}
