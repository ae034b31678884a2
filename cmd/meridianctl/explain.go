package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/spf13/cobra"
)

type explainFlags struct {
	explain  bool
	typ      string
	outbound string
	route    string
	inbound  int
	client   string
}

// explain prints a zone's _explain view: a table by default.
func (a *app) explain(cmd *cobra.Command, mesh, name string, q url.Values, ex explainFlags, output string) error {
	if ex.typ == "" {
		return fmt.Errorf("--explain needs --type, e.g. --type MeshTimeout")
	}
	if ex.outbound != "" && ex.inbound != 0 {
		return fmt.Errorf("--outbound and --inbound exclude each other")
	}
	if ex.client != "" && ex.inbound == 0 {
		return fmt.Errorf("--client needs --inbound PORT")
	}
	if ex.route != "" && ex.outbound == "" {
		return fmt.Errorf("--route needs --outbound SERVICE")
	}
	if output == "" {
		output = "table"
	}
	if output != "table" && output != "json" && output != "yaml" {
		return fmt.Errorf("--output: want table, json or yaml, got %q", output)
	}
	q.Set("type", ex.typ)
	if ex.outbound != "" {
		q.Set("outbound", ex.outbound)
	}
	if ex.route != "" {
		q.Set("route", ex.route)
	}
	if ex.inbound != 0 {
		q.Set("inbound", strconv.Itoa(ex.inbound))
		q.Set("client", ex.client)
	}
	path := "/meshes/" + url.PathEscape(mesh) + "/dataplanes/" + url.PathEscape(name) + "/_explain"
	body, _, err := a.client.do(cmd.Context(), "GET", path, q, nil, "")
	if err != nil {
		return err
	}
	if output != "table" {
		return a.printRaw(body, output)
	}
	var e policy.Explanation
	if err := json.Unmarshal(body, &e); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	return a.printExplanation(name, e)
}

// blockName names a block by the policy's display name (a synced copy's
// hashed name is what `get` lists; -o json shows both).
func blockName(b policy.BlockRef) string {
	name := resource.NamingOf(&resource.Resource{Name: b.Policy.Name, Namespace: b.Policy.Namespace, Labels: b.Policy.Labels}).String()
	if b.Entry != nil {
		return fmt.Sprintf("%s [%d].%s", name, *b.Entry, b.Block)
	}
	return name + " " + b.Block
}

func (a *app) printExplanation(dp string, e policy.Explanation) error {
	target := "proxy-wide"
	switch {
	case e.Target.Route != "":
		target = "outbound " + e.Target.Outbound + ", route " + e.Target.Route
	case e.Target.Outbound != "":
		target = "outbound " + e.Target.Outbound
	case e.Target.Inbound != 0:
		var tags []string
		for k, v := range e.Target.Client {
			tags = append(tags, k+":"+v)
		}
		slices.Sort(tags)
		target = fmt.Sprintf("inbound %d, client {%s}", e.Target.Inbound, strings.Join(tags, ", "))
	}
	fmt.Fprintf(a.stdout, "%s of %s, %s\neffective: %s\n\n", e.Type, dp, target, compact(e.Conf))
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FIELD\tVALUE\tSET BY\tLOST / NOTES")
	for _, f := range e.Fields {
		value, setBy := "(absent)", "-"
		if f.SetBy != nil {
			value, setBy = compact(f.Value), blockName(*f.SetBy)
		}
		var notes []string
		for _, l := range f.Lost {
			notes = append(notes, fmt.Sprintf("%s %s: %s", blockName(l.By), compact(l.Value), l.Reason))
		}
		for _, u := range f.Unsets {
			if u.Applied {
				notes = append(notes, fmt.Sprintf("unset by %s", blockName(u.By)))
			} else {
				notes = append(notes, fmt.Sprintf("%s: %s", blockName(u.By), u.Reason))
			}
		}
		if len(notes) == 0 {
			notes = []string{"-"}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Path, value, setBy, notes[0])
		for _, n := range notes[1:] {
			fmt.Fprintf(tw, "\t\t\t%s\n", n)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(a.stdout)
	tw = tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BLOCK (apply order)\tOUTCOME\tREASON")
	for _, b := range e.Blocks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", blockName(b.BlockRef), b.Outcome, dash(b.Reason))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, w := range e.Warnings {
		fmt.Fprintf(a.stdout, "warning: %s\n", w)
	}
	return nil
}

func compact(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "null"
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return string(raw)
	}
	return string(b)
}
