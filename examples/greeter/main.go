// Command greeter is a small proxyless gRPC workload (docs/dataplane.md):
// a Greeter server and a client, both configured by the zone over xDS
// through the bootstrap meridian-dp writes (GRPC_XDS_BOOTSTRAP). Run them
// under meridian-dp:
//
//	meridian-dp run ... -- greeter serve --listen 127.0.0.1:9090
//	meridian-dp run ... -- greeter call --service greeter --every 500ms
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
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
	greeterv1.RegisterGreeterServiceServer(srv, &greeter{zone: os.Getenv("MERIDIAN_ZONE"), instance: os.Getenv("MERIDIAN_NODE_ID")})
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
}

func (g *greeter) SayHello(_ context.Context, req *greeterv1.SayHelloRequest) (*greeterv1.SayHelloResponse, error) {
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
		cctx, cancel := context.WithTimeout(ctx, *timeout)
		resp, err := client.SayHello(cctx, &greeterv1.SayHelloRequest{Name: "meridian"})
		cancel()
		last = err
		if err != nil {
			st := status.Convert(err)
			fmt.Printf("error %s: %s\n", st.Code(), st.Message())
		} else {
			fmt.Printf("ok %s %s %s\n", resp.GetZone(), resp.GetInstance(), resp.GetMessage())
		}
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
