// Command meridian-dp is the agent a workload runs beside it
// (docs/dataplane.md#joining): it joins the zone as the workload's
// Dataplane, keeps its certificates, and runs the workload with a gRPC xDS
// bootstrap.
//
//	meridian-dp run --cp-address https://ZONE:5678 --dataplane-file dp.yaml \
//	  --dataplane-token-file token [--ca-cert-file ca.pem] [--dir D] -- COMMAND ARGS...
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/meridian-mesh/meridian/internal/agent"
	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/version"
)

func main() {
	cmd := &cobra.Command{Use: "meridian-dp", Short: "Meridian's data plane agent", SilenceUsage: true, SilenceErrors: true}
	cmd.AddCommand(runCommand())
	if err := cmd.Execute(); err != nil {
		var exit exitCode
		if errors.As(err, &exit) {
			os.Exit(int(exit))
		}
		agent.Logf(os.Stderr, "%v", err)
		os.Exit(1)
	}
}

// exitCode ends meridian-dp with the workload's status.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func runCommand() *cobra.Command {
	var cpAddress, dpFile, tokenFile, caFile, dir, proxy, envoyBinary, logLevel string
	cmd := &cobra.Command{
		Use:   "run --cp-address URL --dataplane-file F --dataplane-token-file F [--ca-cert-file F] [--dir D] [--proxy grpc|envoy] -- COMMAND [ARGS...]",
		Short: "join the zone as the workload's Dataplane and run the workload (grpc) or its Envoy sidecar (envoy)",
		RunE: func(cmd *cobra.Command, args []string) error {
			switch proxy {
			case "grpc":
				if len(args) == 0 {
					return errors.New("give the workload's command after --")
				}
			case "envoy":
				// Envoy runs with the bootstrap; arguments after -- are
				// Envoy's.
				path, err := exec.LookPath(envoyBinary)
				if err != nil {
					return fmt.Errorf("--envoy-binary %q: %w (install Envoy, or run proxyless gRPC workloads with --proxy grpc)", envoyBinary, err)
				}
				args = append([]string{path}, args...)
			default:
				return fmt.Errorf("--proxy %q: want grpc (proxyless gRPC) or envoy (an Envoy sidecar)", proxy)
			}
			logger := hclog.New(&hclog.LoggerOptions{Name: "meridian-dp", Level: hclog.LevelFromString(logLevel), Output: os.Stderr})
			return run(cmd.Context(), logger, runConfig{cpAddress: cpAddress, dpFile: dpFile, tokenFile: tokenFile, caFile: caFile,
				dir: dir, proxy: proxy}, args)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&cpAddress, "cp-address", "", "the zone's xDS address, https://HOST:PORT (required)")
	fs.StringVar(&dpFile, "dataplane-file", "", "the workload's Dataplane, Universal YAML or JSON (required)")
	fs.StringVar(&tokenFile, "dataplane-token-file", "", "the Dataplane token (meridianctl generate dataplane-token) (required)")
	fs.StringVar(&caFile, "ca-cert-file", "", "CA (PEM) the zone's xDS certificate verifies to; the zone's generated xds-server.crt, or the system roots when empty")
	fs.StringVar(&dir, "dir", "", "where the bootstrap and certificates go (0700); a fresh temporary directory when empty")
	fs.StringVar(&proxy, "proxy", "grpc", "the workload's kind: grpc (a proxyless gRPC workload, run with GRPC_XDS_BOOTSTRAP) or envoy (an Envoy sidecar, run with its bootstrap and the agent's SDS)")
	fs.StringVar(&envoyBinary, "envoy-binary", "envoy", "with --proxy envoy: the Envoy binary (a name looked up in PATH, or a path)")
	fs.StringVar(&logLevel, "log-level", "info", "log level: trace, debug, info, warn, error")
	for _, f := range []string{"cp-address", "dataplane-file", "dataplane-token-file"} {
		_ = cmd.MarkFlagRequired(f)
	}
	return cmd
}

// runConfig are run's flags.
type runConfig struct {
	cpAddress, dpFile, tokenFile, caFile, dir, proxy string
}

func run(ctx context.Context, logger hclog.Logger, rc runConfig, command []string) error {
	cpAddress, dpFile, tokenFile, caFile, dir := rc.cpAddress, rc.dpFile, rc.tokenFile, rc.caFile, rc.dir
	dataplane, err := os.ReadFile(dpFile)
	if err != nil {
		return fmt.Errorf("--dataplane-file: %w", err)
	}
	// A token readable by other users lets any of them act as the
	// workload, as a zone token file does for a zone.
	if err := auth.CheckPrivateFile(tokenFile); err != nil {
		return fmt.Errorf("--dataplane-token-file: %w", err)
	}
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		return fmt.Errorf("--dataplane-token-file: %w", err)
	}
	var caPEM []byte
	if caFile != "" {
		if caPEM, err = os.ReadFile(caFile); err != nil {
			return fmt.Errorf("--ca-cert-file: %w", err)
		}
	}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "meridian-dp-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return err
	}
	a, err := agent.New(agent.Config{CPAddress: cpAddress, Dataplane: dataplane, Token: string(token), CACert: caPEM,
		Dir: dir, Version: version.Version, Logger: logger})
	if err != nil {
		return err
	}
	defer a.Close()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	joined, err := a.Join(ctx)
	if err != nil {
		return err
	}
	logger.Info("joined the zone", "node", joined.NodeID(), "zone", joined.Zone(), "bootstrap", joined.Bootstrap())
	relay, err := joined.ServeRelay()
	if err != nil {
		return err
	}
	defer relay.Close()
	if rc.proxy == "envoy" {
		if err := joined.WriteEnvoyBootstrap(); err != nil {
			return err
		}
		sds, err := joined.ServeSDS(ctx)
		if err != nil {
			return err
		}
		defer sds.Close()
		logs, err := agent.ForwardAccessLogs(ctx, dir, logger.Named("access-logs"))
		if err != nil {
			return err
		}
		defer logs.Close()
		command = append([]string{command[0], "-c", joined.EnvoyBootstrap()}, command[1:]...)
		logger.Info("running Envoy", "bootstrap", joined.EnvoyBootstrap(), "sds", filepath.Join(dir, agent.SDSSocket))
	}
	held := make(chan struct{})
	go func() {
		defer close(held)
		joined.Hold(ctx)
	}()
	status := runWorkload(logger, joined, command)
	stop()
	<-held
	if status != 0 {
		return exitCode(status)
	}
	return nil
}

// runWorkload runs the command with the bootstrap, forwarding SIGINT and
// SIGTERM, and returns its exit status.
func runWorkload(logger hclog.Logger, joined *agent.Joined, command []string) int {
	c := exec.Command(command[0], command[1:]...)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
	c.Env = append(os.Environ(),
		"GRPC_XDS_BOOTSTRAP="+joined.Bootstrap(),
		"MERIDIAN_NODE_ID="+joined.NodeID(),
		"MERIDIAN_ZONE="+joined.Zone(),
	)
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(signals)
	if err := c.Start(); err != nil {
		agent.Logf(os.Stderr, "start %s: %v", command[0], err)
		return 127
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case sig := <-signals:
				_ = c.Process.Signal(sig)
			case <-done:
				return
			}
		}
	}()
	err := c.Wait()
	close(done)
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			logger.Info("workload ended by a signal", "signal", ws.Signal())
			return 128 + int(ws.Signal())
		}
		return exit.ExitCode()
	}
	agent.Logf(os.Stderr, "workload: %v", err)
	return 1
}
