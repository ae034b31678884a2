// Package zonesim simulates many zones against one global control plane, to
// measure the global's cost per zone at a scale one machine cannot host as
// processes. Each simulated zone is a real sync client (the real protocol:
// TLS, zone token in the stream metadata, handshake, delta batches, ACKs,
// heartbeats) with its own in-memory state, so the global serves it exactly
// as it serves a zone-cp; only the zone's policy engine and API are absent.
// With Config.ReportStatuses a zone also reports a status for each of the
// global's policies it holds, as a zone-cp reports its engine's (report.go).
package zonesim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/meridian-mesh/meridian/internal/plane"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	"github.com/meridian-mesh/meridian/internal/admission"
	"github.com/meridian-mesh/meridian/internal/kds"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// Config describes the simulated fleet. Zones, Target, DialOptions and
// Token are required.
type Config struct {
	// Zones is how many zones to simulate; they are named Prefix0, Prefix1...
	Zones  int
	Prefix string
	// Target is the global's KDS address; DialOptions carry TLS (and gzip).
	Target      string
	DialOptions []grpc.DialOption
	// Token returns the zone token of a zone (issued by the global).
	Token func(zone string) (string, error)
	// Environment of every zone (default universal).
	Environment string
	Registry    *resource.Registry
	Logger      hclog.Logger
	// OnApply, when set, is called for every resource a zone stores, with
	// the time it was applied (from many goroutines).
	OnApply func(zone string, r *resource.Resource, at time.Time)
	// ReportStatuses makes every zone report a status for each of the
	// global's policies it holds, as a zone-cp does, once what it holds
	// has not changed for ReportSettle (default 500 ms).
	ReportStatuses bool
	ReportSettle   time.Duration
}

// Sim is a running fleet of simulated zones.
type Sim struct {
	cfg   Config
	zones []*zone
}

type zone struct {
	name     string
	store    *memStore
	client   *kds.Client
	reporter *reporter // nil unless Config.ReportStatuses
}

// New builds the zones' clients (nothing connects before Run).
func New(cfg Config) (*Sim, error) {
	switch {
	case cfg.Zones < 1:
		return nil, errors.New("zonesim: Zones must be at least 1")
	case cfg.Target == "" || cfg.Token == nil || len(cfg.DialOptions) == 0:
		return nil, errors.New("zonesim: Target, Token and DialOptions are required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "sim-"
	}
	if cfg.Environment == "" {
		cfg.Environment = plane.EnvUniversal
	}
	if cfg.Registry == nil {
		cfg.Registry = resource.NewDefaultRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.ReportSettle <= 0 {
		cfg.ReportSettle = 500 * time.Millisecond
	}
	s := &Sim{cfg: cfg}
	for i := range cfg.Zones {
		name := cfg.Prefix + strconv.Itoa(i)
		z := &zone{name: name}
		z.store = newMemStore(func(r *resource.Resource, at time.Time) {
			if cfg.OnApply != nil {
				cfg.OnApply(name, r, at)
			}
		})
		p, err := plane.NewZone(name, cfg.Environment, "", true)
		if err != nil {
			return nil, fmt.Errorf("zonesim: zone %s: %w", name, err)
		}
		adm, err := admission.New(admission.Config{Registry: cfg.Registry, Plane: p})
		if err != nil {
			return nil, fmt.Errorf("zonesim: zone %s: %w", name, err)
		}
		ccfg := kds.ClientConfig{
			Store: z.store, Registry: cfg.Registry, Plane: p, Admission: adm,
			Token:  func() (string, error) { return cfg.Token(name) },
			Target: cfg.Target, DialOptions: cfg.DialOptions, SoftwareVersion: "zonesim",
			Logger: cfg.Logger.Named(name),
		}
		if cfg.ReportStatuses {
			z.reporter = newReporter(z.store, cfg.Registry, cfg.ReportSettle)
			z.store.onHeld = z.reporter.held
			ccfg.StatusReports = z.reporter
		}
		client, err := kds.NewClient(ccfg)
		if err != nil {
			return nil, fmt.Errorf("zonesim: zone %s: %w", name, err)
		}
		z.client = client
		s.zones = append(s.zones, z)
	}
	return s, nil
}

// Run connects every zone and keeps them syncing until ctx ends.
func (s *Sim) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(s.zones))
	for _, z := range s.zones {
		if z.reporter != nil {
			wg.Go(func() { z.reporter.run(ctx) })
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := z.client.Run(ctx); err != nil {
				errs <- fmt.Errorf("zone %s: %w", z.name, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// Names are the simulated zones' names.
func (s *Sim) Names() []string {
	out := make([]string, len(s.zones))
	for i, z := range s.zones {
		out[i] = z.name
	}
	return out
}

// Connected is how many zones are connected now.
func (s *Sim) Connected() int {
	n := 0
	for _, z := range s.zones {
		if z.client.Status().Connected {
			n++
		}
	}
	return n
}

// MinCount is the fewest resources of typ any zone holds.
func (s *Sim) MinCount(typ string) int {
	least := -1
	for _, z := range s.zones {
		if n := z.store.count(typ); least < 0 || n < least {
			least = n
		}
	}
	return least
}
