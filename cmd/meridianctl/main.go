// Command meridianctl is the CLI over Meridian's REST API.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/meridian-mesh/meridian/internal/flagconfig"
	"github.com/meridian-mesh/meridian/internal/resource"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is main without the process: tests call it directly.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	app := &app{reg: resource.NewDefaultRegistry(), stdin: stdin, stdout: stdout, stderr: stderr}
	root := app.rootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return 1
	}
	return 0
}

type app struct {
	reg        *resource.Registry
	apiAddress string
	token      string
	tokenFile  string
	caFile     string
	client     *client
	stdin      io.Reader
	stdout     io.Writer
	stderr     io.Writer
}

// userToken is --token, or the content of --token-file; "" sends none.
func (a *app) userToken() (string, error) {
	if a.token == "" && a.tokenFile == "" {
		a.token, a.tokenFile = os.Getenv("MERIDIAN_API_TOKEN"), os.Getenv("MERIDIAN_API_TOKEN_FILE")
	}
	if a.token != "" && a.tokenFile != "" {
		return "", fmt.Errorf("--token and --token-file exclude each other")
	}
	if a.tokenFile == "" {
		return strings.TrimSpace(a.token), nil
	}
	data, err := os.ReadFile(a.tokenFile)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", fmt.Errorf("--token-file %s is empty", a.tokenFile)
	}
	return token, nil
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "meridianctl",
		Short:         "CLI for the Meridian control planes",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := flagconfig.Apply(cmd.Flags(), flagconfig.Source{EnvPrefix: "MERIDIAN", Skip: []string{"help"}}); err != nil {
				return err
			}
			token, err := a.userToken()
			if err != nil {
				return err
			}
			c, err := newClient(a.apiAddress, token, a.caFile)
			if err != nil {
				return err
			}
			a.client = c
			return nil
		},
	}
	root.PersistentFlags().StringVar(&a.apiAddress, "api-address", "http://127.0.0.1:5681",
		"control plane REST API (env MERIDIAN_API_ADDRESS)")
	root.PersistentFlags().StringVar(&a.token, "token", "", "user token sent as Authorization: Bearer (env MERIDIAN_API_TOKEN)")
	root.PersistentFlags().StringVar(&a.caFile, "ca-file", "", "CA bundle (PEM) to verify an https:// API, e.g. DATA_DIR/kds-server.crt (env MERIDIAN_CA_FILE)")
	root.PersistentFlags().StringVar(&a.tokenFile, "token-file", "", "file holding the user token, e.g. DATA_DIR/admin-token (env MERIDIAN_API_TOKEN_FILE)")
	root.AddCommand(a.applyCommand(), a.getCommand(), a.deleteCommand(), a.inspectCommand(), a.generateCommand(),
		a.revokeCommand(), a.rotateCommand(), a.retireCommand(), a.versionCommand())
	return root
}
