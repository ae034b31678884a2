package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/xds"
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
	fmt.Fprintln(w, "\n(-o json or -o yaml for the full document; --explain --type T for why a value wins; --xds for the xDS resources)")
	return nil
}

// printXDSSummary prints a Dataplane's data plane state: its agent, its
// xDS stream, per type the version sent and acknowledged and the last
// rejection, mTLS, and what its proxy cannot carry.
func (a *app) printXDSSummary(body []byte) error {
	var v xds.View
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("decode _xds: %w", err)
	}
	w := a.stdout
	fmt.Fprintln(w, "\nData plane")
	switch {
	case v.Agent.Connected:
		fmt.Fprintf(w, "  %-12s connected since %s (meridian-dp %s, token %s)\n", "agent", v.Agent.Since.Format(time.RFC3339), dash(v.Agent.Version), v.Agent.Token)
	case !v.Agent.LeftAt.IsZero():
		fmt.Fprintf(w, "  %-12s left at %s; the Dataplane is removed after the grace period unless it comes back\n", "agent", v.Agent.LeftAt.Format(time.RFC3339))
	default:
		fmt.Fprintf(w, "  %-12s none (a Dataplane written through the API)\n", "agent")
	}
	if v.Connection.Connected {
		fmt.Fprintf(w, "  %-12s connected since %s\n", "xDS", v.Connection.Since.Format(time.RFC3339))
	} else {
		fmt.Fprintf(w, "  %-12s not connected\n", "xDS")
	}
	switch {
	case !v.MTLS.Enabled:
		fmt.Fprintf(w, "  %-12s off: plaintext, MeshTrafficPermission not enforced\n", "mTLS")
	case v.MTLS.Ready:
		fmt.Fprintf(w, "  %-12s on\n", "mTLS")
	default:
		fmt.Fprintf(w, "  %-12s on, no certificates yet: %s\n", "mTLS", v.MTLS.Problem)
	}
	for _, typ := range slices.Sorted(maps.Keys(v.Connection.Types)) {
		ts := v.Connection.Types[typ]
		state := "acked"
		if ts.Acked != ts.Sent {
			state = "pending"
		}
		fmt.Fprintf(w, "  %-12s sent %s, acked %s (%s)\n", typ, dash(ts.Sent), dash(ts.Acked), state)
		if n := ts.Nack; n != nil {
			fmt.Fprintf(w, "  %-12s NACK of %s at %s: %s\n", "", n.Version, n.At.Format(time.RFC3339), n.Message)
			if len(n.Policies) > 0 {
				fmt.Fprintf(w, "  %-12s from %s\n", "", strings.Join(n.Policies, ", "))
			}
		}
	}
	for _, d := range v.Dropped {
		fmt.Fprintf(w, "  not carried: %s\n", d)
	}
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
