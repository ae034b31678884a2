package controlplane

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/meridian-mesh/meridian/internal/flagconfig"
	"github.com/meridian-mesh/meridian/internal/kds"
	"github.com/meridian-mesh/meridian/internal/tuning"
)

// EnvPrefix prefixes every environment variable that sets a flag.
const EnvPrefix = "MERIDIAN"

// CommonFlags are the flags both daemons share.
type CommonFlags struct {
	ConfigFile         string
	DataDir            string
	APIAddress         string
	LogLevel           string
	LogFormat          string
	TombstoneRetention time.Duration
	LocalhostIsAdmin   bool
	AllowedHosts       []string
	APIReadTimeout     time.Duration
	APITLS             bool
	TLSCertFile        string
	TLSKeyFile         string
	HeartbeatInterval  time.Duration
	HeartbeatTimeout   time.Duration
	DebugAddress       string
}

// SyncStream turns the KDS flags into the sync stream's settings.
func (f *CommonFlags) SyncStream() kds.StreamConfig {
	return kds.StreamConfig{HeartbeatInterval: f.HeartbeatInterval, HeartbeatTimeout: f.HeartbeatTimeout}
}

// Register adds the common flags to cmd.
func (f *CommonFlags) Register(cmd *cobra.Command, defaultAPI string) {
	fs := cmd.Flags()
	fs.StringVar(&f.ConfigFile, "config", "", "YAML config file; keys are flag names (flags and "+EnvPrefix+"_* variables win)")
	fs.StringVar(&f.DataDir, "data-dir", "", "directory of the embedded store (required)")
	fs.StringVar(&f.APIAddress, "api-address", defaultAPI, "REST API listen address")
	fs.StringVar(&f.DebugAddress, "debug-address", "", "serve Go's /debug/pprof profiles on this address (loopback only; off when empty)")
	fs.StringVar(&f.LogLevel, "log-level", "info", "log level: trace, debug, info, warn, error")
	fs.StringVar(&f.LogFormat, "log-format", "text", "log format: text or json")
	fs.DurationVar(&f.TombstoneRetention, "tombstone-retention", 24*time.Hour, "how long deletions are kept for resuming peers")
	fs.DurationVar(&f.APIReadTimeout, "api-read-timeout", 60*time.Second, "the longest an API request may take to arrive, body included (a slower upload is cut)")
	fs.DurationVar(&f.HeartbeatInterval, "kds-heartbeat-interval", kds.DefaultHeartbeatInterval, "how often each end of a KDS stream sends a heartbeat")
	fs.DurationVar(&f.HeartbeatTimeout, "kds-heartbeat-timeout", kds.DefaultHeartbeatTimeout, "a KDS stream silent for this long is dead and reconnects (more than the interval)")
	fs.BoolVar(&f.APITLS, "api-tls", false, "serve the REST API over HTTPS with --tls-cert-file/--tls-key-file (else a self-signed certificate generated into the data dir)")
	fs.StringVar(&f.TLSCertFile, "tls-cert-file", "", "TLS certificate (PEM) for KDS (global) and, with --api-tls, the API; self-signed into the data dir when absent")
	fs.StringVar(&f.TLSKeyFile, "tls-key-file", "", "TLS private key (PEM) of --tls-cert-file")
	fs.BoolVar(&f.LocalhostIsAdmin, "api-localhost-is-admin", true, "treat API callers on loopback without a token as admin (remote callers always need a token)")
	fs.StringSliceVar(&f.AllowedHosts, "api-allowed-hosts", nil, "host names, beside loopback IPs and localhost, under which the console is served and loopback callers are admin (comma-separated)")
}

// ApplySources fills unset flags from the environment and the config file.
func (f *CommonFlags) ApplySources(cmd *cobra.Command) error {
	return flagconfig.Apply(cmd.Flags(), flagconfig.Source{EnvPrefix: EnvPrefix, ConfigFile: f.ConfigFile, Skip: []string{"config", "help"}})
}

// Prepare fills unset flags from the environment and the config file, then
// builds the process logger; both daemons start with it.
func (f *CommonFlags) Prepare(cmd *cobra.Command, name string) (hclog.Logger, error) {
	if err := f.ApplySources(cmd); err != nil {
		return nil, err
	}
	return f.NewLogger(name, os.Stderr)
}

// NewLogger builds the process logger from the flags.
func (f *CommonFlags) NewLogger(name string, w io.Writer) (hclog.Logger, error) {
	level := hclog.LevelFromString(f.LogLevel)
	if level == hclog.NoLevel {
		return nil, fmt.Errorf("--log-level: unknown level %q (want trace, debug, info, warn or error)", f.LogLevel)
	}
	var json bool
	switch f.LogFormat {
	case "text":
	case "json":
		json = true
	default:
		return nil, fmt.Errorf("--log-format: want text or json, got %q", f.LogFormat)
	}
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: level, JSONFormat: json, Output: w}), nil
}

// Execute runs cmd with SIGINT/SIGTERM cancelling its context and turns an
// error into one line on stderr and exit status 1. It first makes the
// process-wide settings: the sync streams' gzip and the collector's pacing.
func Execute(cmd *cobra.Command) {
	kds.RegisterGzip()
	tuning.StartGCPacing()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd.SilenceUsage = true
	cmd.SilenceErrors = true
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "%s: error: %s\n", cmd.Name(), strings.ReplaceAll(err.Error(), "\n", "; "))
		stop()
		os.Exit(1)
	}
}
