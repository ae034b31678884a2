package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// describe renders a local validation error with every cause.
func describe(err error) error {
	var verr *resource.ValidationError
	if !errors.As(err, &verr) {
		return err
	}
	return &apiError{Details: "resource is invalid", Causes: verr.Causes}
}

func (a *app) getCommand() *cobra.Command {
	var mesh, namespace, output string
	cmd := &cobra.Command{
		Use:   "get TYPE [NAME]",
		Short: "List resources of a type, or show one",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := a.resolveType(args[0])
			if err != nil {
				return err
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
	switch output {
	case "table":
		if d.Name == "Zone" {
			return a.printZoneList(json.RawMessage(`{"items":[` + string(body) + `]}`))
		}
		var item listItem
		if err := json.Unmarshal(body, &item); err != nil {
			return fmt.Errorf("decode response: %w", err)
		}
		return a.printTable(d, []listItem{item})
	case "yaml":
		return a.printResourceYAML(body)
	}
	return a.printRaw(body, output)
}

// listItem is a listed resource with the parts of its spec and status the
// table shows.
type listItem struct {
	resource.Resource
	spec struct {
		MTLS struct {
			EnabledBackend string `json:"enabledBackend"`
		} `json:"mtls"`
	}
	status policy.PolicyStatus
}

func decodeListItem(raw []byte) (listItem, error) {
	var it listItem
	if err := json.Unmarshal(raw, &it.Resource); err != nil {
		return it, err
	}
	if len(it.Spec) > 0 {
		_ = json.Unmarshal(it.Spec, &it.spec) // shown when readable; the raw spec is -o yaml's
	}
	if len(it.Status) > 0 {
		_ = json.Unmarshal(it.Status, &it.status)
	}
	return it, nil
}

// statusColumn summarizes a zone policy's conditions: the Accepted reason
// when it is not accepted, else the Enforced reason; "-" without status.
func (it listItem) statusColumn() string {
	reason := "-"
	for _, c := range it.status.Conditions {
		switch {
		case c.Type == "Accepted" && c.Status != "True":
			return c.Reason
		case c.Type == "Enforced":
			reason = c.Reason
		}
	}
	return reason
}

type listResponse = api.List[json.RawMessage]

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
	if len(all) == 0 && d.Scope == resource.ScopeMesh {
		if err := a.meshExists(cmd, mesh); err != nil {
			return err
		}
	}
	switch output {
	case "yaml":
		// One document per resource: apply -f takes it back unchanged.
		for i, raw := range all {
			if i > 0 {
				fmt.Fprintln(a.stdout, "---")
			}
			if err := a.printResourceYAML(raw); err != nil {
				return err
			}
		}
		return nil
	case "json":
		body, err := json.Marshal(map[string]any{"total": len(all), "items": all})
		if err != nil {
			return err
		}
		return a.printRaw(body, output)
	}
	if d.Name == "Zone" {
		body, err := json.Marshal(map[string]any{"items": all})
		if err != nil {
			return err
		}
		return a.printZoneList(body)
	}
	items := make([]listItem, 0, len(all))
	for _, raw := range all {
		it, err := decodeListItem(raw)
		if err != nil {
			return fmt.Errorf("decode response: %w", err)
		}
		items = append(items, it)
	}
	return a.printTable(d, items)
}

// meshExists turns a list of an unknown mesh into an error instead of an
// empty table.
func (a *app) meshExists(cmd *cobra.Command, mesh string) error {
	_, _, err := a.client.do(cmd.Context(), "GET", "/meshes/"+url.PathEscape(mesh), nil, nil, "")
	var apiErr *apiError
	if errors.As(err, &apiErr) && apiErr.Status == 404 {
		return fmt.Errorf("mesh %q not found (list meshes with: meridianctl get meshes)", mesh)
	}
	return err
}

// envelopeOrder is the order of a resource's top-level keys in YAML output:
// identity first, then labels, spec and status, then the read-only fields.
var envelopeOrder = []string{"type", "mesh", "name", "namespace", "labels", "spec", "status"}

// printResourceYAML prints one resource (the API's JSON) as YAML in
// envelope order, which apply -f takes back.
func (a *app) printResourceYAML(body []byte) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	keys := make([]string, 0, len(obj))
	for _, k := range envelopeOrder {
		if _, ok := obj[k]; ok {
			keys = append(keys, k)
		}
	}
	rest := make([]string, 0, len(obj))
	for k := range obj {
		if !slices.Contains(envelopeOrder, k) {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	var buf bytes.Buffer
	for _, k := range append(keys, rest...) {
		one, err := json.Marshal(map[string]json.RawMessage{k: obj[k]})
		if err != nil {
			return err
		}
		y, err := yaml.JSONToYAML(one)
		if err != nil {
			return err
		}
		buf.Write(y)
	}
	_, err := a.stdout.Write(buf.Bytes())
	return err
}

// printZoneList prints the global's zones (GET /zones) as inspect zones does.
func (a *app) printZoneList(body []byte) error {
	var page api.List[api.ZoneItem]
	if err := json.Unmarshal(body, &page); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	return a.printZones(page.Items)
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

func (a *app) printTable(d *resource.TypeDescriptor, items []listItem) error {
	if d.Name == "Mesh" {
		return a.printMeshes(items)
	}
	withStatus := false
	for _, it := range items {
		withStatus = withStatus || len(it.status.Conditions) > 0
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

// printMeshes: a mesh's name, mTLS backend and origin mean something; a
// mesh column and a namespace do not.
func (a *app) printMeshes(items []listItem) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tMTLS\tORIGIN\tVERSION\tAGE")
	for _, it := range items {
		mtls := "off"
		if it.spec.MTLS.EnabledBackend != "" {
			mtls = it.spec.MTLS.EnabledBackend
		}
		age := "-"
		if !it.ModificationTime.IsZero() {
			age = time.Since(it.ModificationTime).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", it.Name, mtls, dash(it.Labels.Get(resource.LabelOrigin)), it.Version, age)
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
			d, err := a.resolveType(args[0])
			if err != nil {
				return err
			}
			q := url.Values{}
			if namespace != "" {
				q.Set("namespace", namespace)
			}
			if _, _, err := a.client.do(cmd.Context(), "DELETE", resourcePath(d, mesh, args[1]), q, nil, ""); err != nil {
				return err
			}
			key := resource.Key{Type: d.Name, Name: args[1], Namespace: namespace}
			if d.Scope == resource.ScopeMesh {
				key.Mesh = mesh
			}
			fmt.Fprintf(a.stdout, "%s deleted\n", key)
			return nil
		},
	}
	cmd.Flags().StringVarP(&mesh, "mesh", "m", "default", "mesh")
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "namespace (zones in Kubernetes environment)")
	return cmd
}
