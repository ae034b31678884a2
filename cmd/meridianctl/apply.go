package main

import (
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/meridian-mesh/meridian/internal/resource"
)

func (a *app) applyCommand() *cobra.Command {
	var files []string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "apply -f FILE|DIR|- [-f ...] [--dry-run]",
		Short: "Create or update resources from YAML or JSON files (multi-document), directories or standard input",
		Long: "Each -f names a file, a directory (every *.yaml, *.yml and *.json below it, recursively, in path order) " +
			"or - for standard input. Documents are Universal or Kubernetes shaped, as kumactl and kubectl take them. " +
			"--dry-run has the control plane validate and check every document (owner, mesh, names) without storing anything.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			inputs, err := a.expandInputs(files)
			if err != nil {
				return err
			}
			failed, total := 0, 0
			for _, in := range inputs {
				f, n, err := a.applyInput(cmd, in, dryRun)
				if err != nil {
					return err
				}
				failed, total = failed+f, total+n
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d resources failed", failed, total)
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&files, "file", "f", nil, "file, directory or - (standard input); repeatable (required)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "validate and check on the server, store nothing")
	_ = cmd.MarkFlagRequired("file")
	return cmd
}

// expandInputs turns -f values into files to read, in order: a directory
// becomes its *.yaml, *.yml and *.json files, recursively, sorted by path.
func (a *app) expandInputs(args []string) ([]string, error) {
	var out []string
	for _, arg := range args {
		if arg == "-" {
			out = append(out, arg)
			continue
		}
		info, err := os.Stat(arg)
		if err != nil {
			return nil, fmt.Errorf("-f %s: %w", arg, err)
		}
		if !info.IsDir() {
			out = append(out, arg)
			continue
		}
		var found []string
		err = filepath.WalkDir(arg, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			switch strings.ToLower(filepath.Ext(path)) {
			case ".yaml", ".yml", ".json":
				if !d.IsDir() {
					found = append(found, path)
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("-f %s: %w", arg, err)
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("-f %s: no *.yaml, *.yml or *.json file in the directory", arg)
		}
		sort.Strings(found)
		out = append(out, found...)
	}
	return out, nil
}

// applyInput sends every document of one input, reporting each outcome;
// it returns how many failed and how many there were. An unreadable or
// unsplittable input is an error.
func (a *app) applyInput(cmd *cobra.Command, in string, dryRun bool) (failed, total int, err error) {
	var data []byte
	if in == "-" {
		data, err = io.ReadAll(a.stdin)
	} else {
		data, err = os.ReadFile(in)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("read %s: %w", in, err)
	}
	docs, err := resource.SplitDocuments(data)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", in, err)
	}
	for i, doc := range docs {
		label, outcome, err := a.applyOne(cmd, doc, dryRun)
		if label == "" {
			label = fmt.Sprintf("document %d", i+1)
			if in != "-" {
				label = fmt.Sprintf("%s: document %d", in, i+1)
			}
		}
		if err != nil {
			failed++
			fmt.Fprintf(a.stdout, "%s: error: %v\n", label, err)
			continue
		}
		fmt.Fprintf(a.stdout, "%s %s\n", label, outcome)
	}
	return failed, len(docs), nil
}

func (a *app) applyOne(cmd *cobra.Command, doc []byte, dryRun bool) (string, string, error) {
	res, err := a.reg.Decode(doc)
	if err != nil {
		return "", "", describe(err)
	}
	d, _ := a.reg.Lookup(res.Type)
	if d.Scope == resource.ScopeMesh && res.Mesh == "" {
		res.Mesh = "default"
	}
	if res.Name == "" {
		return "", "", fmt.Errorf("%s without a name: set name (Universal shape) or metadata.name (Kubernetes shape)", res.Type)
	}
	label := res.Key().String()
	q := url.Values{}
	if res.Namespace != "" {
		q.Set("namespace", res.Namespace)
	}
	if dryRun {
		q.Set("dryRun", "true")
	}
	body, err := a.reg.EncodeJSON(res)
	if err != nil {
		return label, "", err
	}
	_, hdr, err := a.client.do(cmd.Context(), "PUT", resourcePath(d, res.Mesh, res.Name), q, body, "")
	if err != nil {
		return label, "", err
	}
	return label, hdr.Get("Meridian-Outcome"), nil
}
