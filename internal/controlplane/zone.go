package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/keepalive"

	"github.com/meridian-mesh/meridian/internal/admission"
	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/kds"
	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/policyview"
	"github.com/meridian-mesh/meridian/internal/xds"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// startZone starts the zone's policy view and, with a global address, its
// KDS client, and points the API at them.
func (p *process) startZone(ctx context.Context) error {
	cfg := p.cfg
	var programmed atomic.Pointer[xds.Controller] // the data plane's, once it runs
	view, err := policyview.New(policyview.Config{Registry: p.reg, Store: p.store, Plane: cfg.Plane, Logger: cfg.Logger.Named("policy"),
		Decorate: reportProgrammed(&programmed)})
	if err != nil {
		return err
	}
	p.api.Snapshots = view
	var client *kds.Client
	if cfg.Plane.Federated {
		// Its configuration (the token file) is checked before anything
		// binds an address.
		if client, err = p.newZoneClient(viewReports{view}); err != nil {
			return err
		}
	}
	p.run(ctx, view.Run)
	if cfg.XDSAddress != "" {
		if err := p.startDataPlane(ctx, view, &programmed); err != nil {
			return err
		}
	}
	if client == nil {
		return nil
	}
	p.run(ctx, view.RunStatusReports)
	p.api.SyncStatus = func() any { return client.Status() }
	p.api.Rejections = client
	p.run(ctx, client.Run)
	return nil
}

// newZoneClient builds the zone's connection to the global.
func (p *process) newZoneClient(reports kds.StatusReporter) (*kds.Client, error) {
	cfg := p.cfg
	if cfg.ZoneTokenFile == "" {
		return nil, errors.New("--zone-token-file is required with --global-address (issue one with meridianctl generate zone-token)")
	}
	if _, err := readToken(cfg.ZoneTokenFile); err != nil {
		return nil, err
	}
	tlsCfg, err := auth.ClientTLS(auth.ClientTLSConfig{CAFile: cfg.KDSCAFile, SkipVerify: cfg.KDSSkipVerify})
	if err != nil {
		return nil, err
	}
	if cfg.KDSSkipVerify {
		cfg.Logger.Warn("not verifying the global's KDS certificate (--kds-skip-verify)")
	}
	adm, err := admission.New(admission.Config{Registry: p.reg, Plane: cfg.Plane})
	if err != nil {
		return nil, err
	}
	target, targets := globalTargets(cfg.GlobalAddress)
	return kds.NewClient(kds.ClientConfig{
		Store: p.store, Registry: p.reg, Plane: cfg.Plane,
		Admission:     adm,
		Token:         func() (string, error) { return readToken(cfg.ZoneTokenFile) },
		Target:        target,
		Targets:       targets,
		StatusReports: reports,
		DialOptions: []grpc.DialOption{
			// gRPC's own transport reconnect backoff (up to 120 s by default)
			// would sit under the KDS client's 5 s cap. It is kept at 1 s:
			// the client waits for the connection to come back (see
			// Client.pause), so the zone notices a returning global within
			// about a second; a dial a second to a down global is cheap.
			grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: 5 * time.Second, Backoff: backoff.Config{
				BaseDelay: kds.DefaultReconnectBackoff, Multiplier: 1.6, Jitter: 0.2,
				MaxDelay: time.Second}}),
			grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
			grpc.WithStatsHandler(p.trimmer.GRPCStats()),
			grpc.WithDefaultCallOptions(grpc.UseCompressor(gzip.Name), grpc.MaxCallRecvMsgSize(maxKDSMessageBytes)),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		},
		SoftwareVersion: cfg.Version, Logger: cfg.Logger.Named("kds"), Metrics: p.metrics, Stream: cfg.SyncStream,
	})
}

// readToken reads the zone token file, re-read before every connection so a
// rotated token is picked up.
func readToken(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("zone token file: %w", err)
	}
	if err := auth.CheckPrivateFile(path); err != nil {
		return "", fmt.Errorf("zone token file: %w", err)
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", fmt.Errorf("zone token file %s is empty", path)
	}
	return token, nil
}

// viewReports adapts the zone's policy view to the KDS client's status
// reporter: the statuses of the global's policies, as the global names them.
type viewReports struct{ v *policyview.View }

func (r viewReports) PolicyStatusReport() (*syncv1.PolicyStatusReport, <-chan struct{}) {
	list, changed := r.v.GlobalPolicyStatuses()
	if list == nil {
		return nil, changed
	}
	rep := &syncv1.PolicyStatusReport{Statuses: make([]*syncv1.PolicyStatus, 0, len(list))}
	// Policies with the same status share its conditions (the engine
	// hands them out once per distinct status), and so do their messages:
	// the report is only marshaled. At 100,000 policies, most overridden
	// alike, that is a few condition messages instead of 200,000.
	type condsKey struct {
		first *policy.Condition
		n     int
	}
	shared := map[condsKey][]*syncv1.Condition{}
	for _, st := range list {
		ps := &syncv1.PolicyStatus{Key: &syncv1.ResourceKey{Type: st.Type, Mesh: st.Mesh, Name: st.Name}}
		if len(st.Conditions) > 0 {
			key := condsKey{&st.Conditions[0], len(st.Conditions)}
			conds, ok := shared[key]
			if !ok {
				conds = make([]*syncv1.Condition, 0, len(st.Conditions))
				for _, c := range st.Conditions {
					conds = append(conds, &syncv1.Condition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message})
				}
				shared[key] = conds
			}
			ps.Conditions = conds
		}
		rep.Statuses = append(rep.Statuses, ps)
	}
	return rep, changed
}

// globalTargets splits --global-address: one address (or a DNS name, whose
// records gRPC spreads over), or several comma-separated replicas.
func globalTargets(addr string) (string, []string) {
	var out []string
	for _, a := range strings.Split(addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	if len(out) <= 1 {
		return strings.Join(out, ""), nil
	}
	return "", out
}
