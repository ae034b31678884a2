// Command fakeenvoy stands in for Envoy, which cannot run on this
// project's machines, in the integration suite: started by meridian-dp
// --proxy envoy as "envoy -c BOOTSTRAP", it reads the bootstrap as Envoy
// would (checked against Envoy's protos), fetches the workload's secrets
// from the agent's SDS socket and its listeners and clusters from the
// zone over ADS with the bootstrap's TLS, prints one line per resource
// ("sds NAME key=yes|no", "lds NAME", "cds NAME"), then waits for a
// signal.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3" // the bootstrap's protocol options
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fakeenvoy:", err)
		os.Exit(1)
	}
}

func run() error {
	var path string
	for i, a := range os.Args {
		if a == "-c" && i+1 < len(os.Args) {
			path = os.Args[i+1]
		}
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("-c: %w", err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(raw, &b); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	if err := b.ValidateAll(); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Both static clusters are the agent's unix sockets: its SDS server
	// and its xDS relay to the zone.
	var sdsPath, adsPath string
	for _, c := range b.GetStaticResources().GetClusters() {
		addr := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress()
		if addr.GetPipe() == nil {
			return fmt.Errorf("cluster %s: want a unix socket, got %v", c.GetName(), addr)
		}
		if c.GetName() == "meridian_dp_sds" {
			sdsPath = addr.GetPipe().GetPath()
		} else {
			adsPath = addr.GetPipe().GetPath()
		}
	}
	node := b.GetNode()
	mesh := node.GetCluster()
	// SDS from the agent.
	conn, err := grpc.NewClient("unix://"+sdsPath, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	sds, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
	if err != nil {
		return err
	}
	if err := sds.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.SecretType,
		ResourceNames: []string{"identity_cert:secret:" + mesh, "mesh_ca:secret:" + mesh}}); err != nil {
		return err
	}
	resp, err := sds.Recv()
	if err != nil {
		return fmt.Errorf("sds: %w", err)
	}
	for _, a := range resp.GetResources() {
		var s tlsv3.Secret
		if err := a.UnmarshalTo(&s); err != nil {
			return err
		}
		key := "no"
		if len(s.GetTlsCertificate().GetPrivateKey().GetInlineBytes()) > 0 {
			key = "yes"
		}
		fmt.Printf("sds %s key=%s\n", s.GetName(), key)
	}
	// ADS from the zone through the agent's relay.
	xconn, err := grpc.NewClient("unix://"+adsPath, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer xconn.Close()
	ads, err := discoveryv3.NewAggregatedDiscoveryServiceClient(xconn).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	for _, typeURL := range []string{resourcev3.ListenerType, resourcev3.ClusterType} {
		if err := ads.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL}); err != nil {
			return err
		}
		resp, err := ads.Recv()
		if err != nil {
			return fmt.Errorf("ads: %w", err)
		}
		for _, a := range resp.GetResources() {
			switch resp.GetTypeUrl() {
			case resourcev3.ListenerType:
				var l listenerv3.Listener
				if err := a.UnmarshalTo(&l); err != nil {
					return err
				}
				fmt.Printf("lds %s\n", l.GetName())
			case resourcev3.ClusterType:
				var c clusterv3.Cluster
				if err := a.UnmarshalTo(&c); err != nil {
					return err
				}
				fmt.Printf("cds %s\n", c.GetName())
			}
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	return nil
}
