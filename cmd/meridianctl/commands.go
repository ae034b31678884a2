package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/meridian-mesh/meridian/internal/resource"
)

func (a *app) applyCommand() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "apply -f FILE|-",
		Short: "Create or update resources from a multi-document YAML or JSON file",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			data, err := a.readInput(file)
			if err != nil {
				return err
			}
			return a.apply(cmd, data)
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "file to apply, - for standard input (required)")
	_ = cmd.MarkFlagRequired("file")
	return cmd
}

func (a *app) readInput(file string) ([]byte, error) {
	if file == "-" {
		return io.ReadAll(a.stdin)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	return data, nil
}

// apply sends every document, reporting each outcome; it fails if any did.
func (a *app) apply(cmd *cobra.Command, data []byte) error {
	docs, err := resource.SplitDocuments(data)
	if err != nil {
		return err
	}
	failed := 0
	for i, doc := range docs {
		label, outcome, err := a.applyOne(cmd, doc)
		if label == "" {
			label = fmt.Sprintf("document %d", i+1)
		}
		if err != nil {
			failed++
			fmt.Fprintf(a.stdout, "%s: error: %v\n", label, err)
			continue
		}
		fmt.Fprintf(a.stdout, "%s %s\n", label, outcome)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d resources failed", failed, len(docs))
	}
	return nil
}

func (a *app) applyOne(cmd *cobra.Command, doc []byte) (string, string, error) {
	res, err := a.reg.Decode(doc)
	if err != nil {
		return "", "", describe(err)
	}
	d, _ := a.reg.Lookup(res.Type)
	if d.Scope == resource.ScopeMesh && res.Mesh == "" {
		res.Mesh = "default"
	}
	label := res.Key().String()
	q := url.Values{}
	if res.Namespace != "" {
		q.Set("namespace", res.Namespace)
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

// describe renders a local validation error with every cause.
func describe(err error) error {
	var verr *resource.ValidationError
	if !errors.As(err, &verr) {
		return err
	}
	e := &apiError{Details: "resource is invalid", Causes: verr.Causes}
	return e
}

func (a *app) getCommand() *cobra.Command {
	var mesh, namespace, output string
	cmd := &cobra.Command{
		Use:   "get TYPE [NAME]",
		Short: "List resources of a type, or show one",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, ok := a.reg.Resolve(args[0])
			if !ok {
				return fmt.Errorf("unknown resource type %q (known: %v)", args[0], a.reg.Names())
			}
			q := url.Values{}
			if namespace != "" {
				q.Set("namespace", namespace)
			}
			if len(args) == 2 {
				return a.getOne(cmd, d, mesh, args[1], q, output)
			}
			return a.getList(cmd, d, mesh, q, output)
		},
	}
	cmd.Flags().StringVarP(&mesh, "mesh", "m", "default", "mesh")
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "namespace (zones in Kubernetes environment)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table, yaml or json")
	return cmd
}

func checkOutput(output string) error {
	switch output {
	case "table", "yaml", "json":
		return nil
	}
	return fmt.Errorf("--output: want table, yaml or json, got %q", output)
}

func (a *app) getOne(cmd *cobra.Command, d *resource.TypeDescriptor, mesh, name string, q url.Values, output string) error {
	if err := checkOutput(output); err != nil {
		return err
	}
	body, _, err := a.client.do(cmd.Context(), "GET", resourcePath(d, mesh, name), q, nil, "")
	if err != nil {
		return err
	}
	if output == "table" {
		var item listItem
		if err := json.Unmarshal(body, &item); err != nil {
			return fmt.Errorf("decode response: %w", err)
		}
		return a.printTable([]listItem{item})
	}
	return a.printRaw(body, output)
}

// listItem holds the columns of the table view.
type listItem struct {
	Type             string    `json:"type"`
	Mesh             string    `json:"mesh"`
	Name             string    `json:"name"`
	Namespace        string    `json:"namespace"`
	Version          uint64    `json:"version"`
	ModificationTime time.Time `json:"modificationTime"`
	Status           struct {
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
			Reason string `json:"reason"`
		} `json:"conditions"`
	} `json:"status"`
}

// statusColumn summarizes a zone policy's conditions: the Accepted reason
// when it is not accepted, else the Enforced reason; "-" without status.
func (it listItem) statusColumn() string {
	reason := "-"
	for _, c := range it.Status.Conditions {
		switch {
		case c.Type == "Accepted" && c.Status != "True":
			return c.Reason
		case c.Type == "Enforced":
			reason = c.Reason
		}
	}
	return reason
}

type listResponse struct {
	Total int               `json:"total"`
	Items []json.RawMessage `json:"items"`
	Next  *string           `json:"next"`
}

// getList fetches every page, then prints.
func (a *app) getList(cmd *cobra.Command, d *resource.TypeDescriptor, mesh string, q url.Values, output string) error {
	if err := checkOutput(output); err != nil {
		return err
	}
	var all []json.RawMessage
	q.Set("size", "1000")
	for offset := 0; ; {
		q.Set("offset", strconv.Itoa(offset))
		body, _, err := a.client.do(cmd.Context(), "GET", resourcePath(d, mesh, ""), q, nil, "")
		if err != nil {
			return err
		}
		var page listResponse
		if err := json.Unmarshal(body, &page); err != nil {
			return fmt.Errorf("decode response: %w", err)
		}
		all = append(all, page.Items...)
		offset += len(page.Items)
		if page.Next == nil || len(page.Items) == 0 {
			break
		}
	}
	if output != "table" {
		body, err := json.Marshal(map[string]any{"total": len(all), "items": all})
		if err != nil {
			return err
		}
		return a.printRaw(body, output)
	}
	items := make([]listItem, 0, len(all))
	for _, raw := range all {
		var it listItem
		if err := json.Unmarshal(raw, &it); err != nil {
			return fmt.Errorf("decode response: %w", err)
		}
		items = append(items, it)
	}
	return a.printTable(items)
}

func (a *app) printRaw(body []byte, output string) error {
	if output == "yaml" {
		y, err := yaml.JSONToYAML(body)
		if err != nil {
			return err
		}
		_, err = a.stdout.Write(y)
		return err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, bytes.TrimSpace(body), "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err := a.stdout.Write(buf.Bytes())
	return err
}

func (a *app) printTable(items []listItem) error {
	withStatus := false
	for _, it := range items {
		withStatus = withStatus || len(it.Status.Conditions) > 0
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 3, ' ', 0)
	header := "MESH\tNAME\tNAMESPACE\tTYPE\tVERSION\tAGE"
	if withStatus {
		header += "\tSTATUS"
	}
	fmt.Fprintln(tw, header)
	for _, it := range items {
		age := "-"
		if !it.ModificationTime.IsZero() {
			age = time.Since(it.ModificationTime).Round(time.Second).String()
		}
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%d\t%s", dash(it.Mesh), it.Name, dash(it.Namespace), it.Type, it.Version, age)
		if withStatus {
			line += "\t" + it.statusColumn()
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (a *app) deleteCommand() *cobra.Command {
	var mesh, namespace string
	cmd := &cobra.Command{
		Use:   "delete TYPE NAME",
		Short: "Delete a resource",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, ok := a.reg.Resolve(args[0])
			if !ok {
				return fmt.Errorf("unknown resource type %q (known: %v)", args[0], a.reg.Names())
			}
			q := url.Values{}
			if namespace != "" {
				q.Set("namespace", namespace)
			}
			if _, _, err := a.client.do(cmd.Context(), "DELETE", resourcePath(d, mesh, args[1]), q, nil, ""); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "%s %s deleted\n", d.Name, args[1])
			return nil
		},
	}
	cmd.Flags().StringVarP(&mesh, "mesh", "m", "default", "mesh")
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "namespace (zones in Kubernetes environment)")
	return cmd
}
