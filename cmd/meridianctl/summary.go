package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// printConfigSummary prints a Dataplane's _config readably: per inbound
// and outbound, each policy type's conf in one line and the policies it
// came from (last wins); -o json|yaml gives the whole document.
func (a *app) printConfigSummary(body []byte) error {
	var v policy.ConfigResult
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	w := a.stdout
	fmt.Fprintf(w, "Dataplane %s/%s", v.Dataplane.Mesh, resource.NamingOf(&resource.Resource{Name: v.Dataplane.Name, Namespace: v.Dataplane.Namespace}))
	fmt.Fprintf(w, ": %d inbound(s), %d outbound(s)\n", len(v.Inbounds), len(v.Outbounds))
	for _, in := range v.Inbounds {
		fmt.Fprintf(w, "\nInbound %d (%s)\n", in.Port, dash(in.Tags["kuma.io/service"]))
		for _, typ := range slices.Sorted(maps.Keys(in.Policies)) {
			for _, r := range in.Policies[typ].Rules {
				fmt.Fprintf(w, "  %-26s %s%s  from %s\n", typ, clientsOf(r.Matchers), oneLine(r.Conf), origins(r.Origin))
			}
		}
		if in.RBAC.Rules != nil && len(in.RBAC.Rules.Policies) == 0 {
			fmt.Fprintf(w, "  %-26s no client allowed\n", "RBAC")
		}
	}
	for _, out := range v.Outbounds {
		fmt.Fprintf(w, "\nOutbound %d -> %s\n", out.Port, dash(out.Service))
		for _, typ := range slices.Sorted(maps.Keys(out.Policies)) {
			p := out.Policies[typ]
			fmt.Fprintf(w, "  %-26s %s  from %s\n", typ, oneLine(p.Conf), origins(p.Origin))
		}
	}
	if len(v.Proxy) > 0 {
		fmt.Fprintln(w, "\nWhole proxy")
		for _, typ := range slices.Sorted(maps.Keys(v.Proxy)) {
			p := v.Proxy[typ]
			fmt.Fprintf(w, "  %-26s %s  from %s\n", typ, oneLine(p.Conf), origins(p.Origin))
		}
	}
	for _, warn := range v.Warnings {
		fmt.Fprintf(w, "\nwarning: %s\n", warn)
	}
	fmt.Fprintln(w, "\n(-o json or -o yaml for the full document; --explain --type T for why a value wins)")
	return nil
}

// clientsOf renders a rule's client subset: "" for every client.
func clientsOf(ms []policy.Matcher) string {
	if len(ms) == 0 {
		return ""
	}
	parts := make([]string, len(ms))
	for i, m := range ms {
		op := "="
		if m.Not {
			op = "!="
		}
		parts[i] = m.Key + op + m.Value
	}
	return "[clients " + strings.Join(parts, ", ") + "] "
}

// oneLine is a conf as compact JSON, cut at 100 characters.
func oneLine(conf json.RawMessage) string {
	var buf bytes.Buffer
	if len(conf) == 0 || json.Compact(&buf, conf) != nil {
		return "-"
	}
	s := buf.String()
	if len(s) > 100 {
		s = s[:97] + "..."
	}
	return s
}

// origins lists the policies a conf came from, in apply order.
func origins(os []policy.Origin) string {
	if len(os) == 0 {
		return "-"
	}
	names := make([]string, 0, len(os))
	for _, o := range os {
		// A synced copy by the name it was written under, and where.
		n := resource.NamingOf(&resource.Resource{Name: o.Name, Namespace: o.Namespace, Labels: o.Labels}).String()
		if o.Block != "" {
			n += " (" + o.Block + ")"
		}
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return strings.Join(names, ", ")
}
