package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/xds"
)

// Zone pages: Dataplanes, one Dataplane (effective configuration per
// inbound and outbound, who set each field, the MeshTrafficPermission
// decision as a table, a what-if form) and the full explanation of one
// target.

// dpPageSize is smaller than pageSize: each row asks the engine for the
// proxy's rules (its matched policies).
const dpPageSize = 25

type dpRow struct {
	dataplane
	Inbounds, Outbounds int
	Matched             int
	MatchedErr          string
	Services            []string
}

type dataplanesData struct {
	Meshes []string
	Mesh   string
	Query  string
	Rows   []dpRow
	Total  int
	Pager  pager
}

func (c *Console) dataplanesPage(w http.ResponseWriter, r *http.Request) {
	meshes, mesh, err := c.meshChoice(r)
	if err != nil {
		c.fail(w, r, "Dataplanes", err)
		return
	}
	d := dataplanesData{Meshes: meshes, Mesh: mesh, Query: strings.TrimSpace(r.URL.Query().Get("q"))}
	offset, _ := strconv.Atoi(r.URL.Query().Get("offset"))
	offset = max(0, offset)
	base := "/meshes/" + url.PathEscape(d.Mesh) + "/dataplanes"
	var shown []dataplane
	if d.Query == "" {
		var l api.List[dataplane]
		if err := c.get(r, fmt.Sprintf("%s?size=%d&offset=%d", base, dpPageSize, offset), &l); err != nil {
			c.fail(w, r, "Dataplanes", err)
			return
		}
		shown, d.Total = l.Items, l.Total
	} else {
		all, err := c.allDataplanes(r, base)
		if err != nil {
			c.fail(w, r, "Dataplanes", err)
			return
		}
		var match []dataplane
		for _, dp := range all {
			if dpMatches(dp, d.Query) {
				match = append(match, dp)
			}
		}
		d.Total = len(match)
		shown = match[min(offset, len(match)):min(offset+dpPageSize, len(match))]
	}
	d.Pager = newPager(r, d.Total, dpPageSize)
	d.Rows = c.dpRows(r, shown)
	c.render(w, r, http.StatusOK, "dataplanes", page{Title: "Dataplanes in " + d.Mesh, Nav: "dataplanes", Data: d})
}

// allDataplanes reads every Dataplane of a mesh (for search), page by page.
func (c *Console) allDataplanes(r *http.Request, base string) ([]dataplane, error) {
	var out []dataplane
	for off := 0; ; off += 1000 {
		var l api.List[dataplane]
		if err := c.get(r, fmt.Sprintf("%s?size=1000&offset=%d", base, off), &l); err != nil {
			return nil, err
		}
		out = append(out, l.Items...)
		if len(l.Items) < 1000 || len(out) >= l.Total {
			return out, nil
		}
	}
}

// dpMatches: the search matches the name, namespace, address or a tag value.
func dpMatches(dp dataplane, q string) bool {
	q = strings.ToLower(q)
	hay := []string{dp.Name, dp.Namespace, dp.Networking.Address}
	for _, in := range dp.Networking.Inbound {
		for k, v := range in.Tags {
			hay = append(hay, v, k+"="+v)
		}
	}
	for _, h := range hay {
		if strings.Contains(strings.ToLower(h), q) {
			return true
		}
	}
	return false
}

// dpRows adds each proxy's matched-policy count (distinct policies in its
// _rules), a few engine calls at a time.
func (c *Console) dpRows(r *http.Request, dps []dataplane) []dpRow {
	rows := make([]dpRow, len(dps))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i, dp := range dps {
		rows[i] = dpRow{dataplane: dp, Inbounds: len(dp.Networking.Inbound), Outbounds: len(dp.Networking.Outbound)}
		for _, in := range dp.Networking.Inbound {
			if s := in.Tags["kuma.io/service"]; s != "" && !slices.Contains(rows[i].Services, s) {
				rows[i].Services = append(rows[i].Services, s)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			var rules json.RawMessage
			if err := c.get(r, dpPath(dp.Mesh, dp.Name, dp.Namespace, "_rules", nil), &rules); err != nil {
				rows[i].MatchedErr = err.Error()
				return
			}
			rows[i].Matched = countOrigins(rules)
		}()
	}
	wg.Wait()
	return rows
}

// countOrigins counts the distinct policies named in any "origin" list.
func countOrigins(doc json.RawMessage) int {
	var v any
	if json.Unmarshal(doc, &v) != nil {
		return 0
	}
	seen := map[string]bool{}
	var walk func(any)
	walk = func(x any) {
		switch t := x.(type) {
		case map[string]any:
			for k, v := range t {
				if k == "origin" {
					if list, ok := v.([]any); ok {
						for _, o := range list {
							if m, ok := o.(map[string]any); ok {
								seen[fmt.Sprint(m["type"], "/", m["namespace"], "/", m["name"])] = true
							}
						}
					}
					continue
				}
				walk(v)
			}
		case []any:
			for _, v := range t {
				walk(v)
			}
		}
	}
	walk(v)
	return len(seen)
}

func dpPath(mesh, name, namespace, sub string, q url.Values) string {
	p := "/meshes/" + url.PathEscape(mesh) + "/dataplanes/" + url.PathEscape(name)
	if sub != "" {
		p += "/" + sub
	}
	if q == nil {
		q = url.Values{}
	}
	if namespace != "" {
		q.Set("namespace", namespace)
	}
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	return p
}

// targetConf is one policy type's effective conf on a target, field by
// field with who set it.
type targetConf struct {
	Type    string
	Conf    string
	Fields  []fieldRow
	Explain string // the explain page of this target and type
	Err     string
}

type fieldRow struct {
	Path, Value, SetBy string
	Lost               int
}

type dataplaneData struct {
	DP     dataplane
	Config policy.ConfigResult
	// XDS is the proxy's data plane state, where the zone serves xDS.
	XDS       *xds.View
	Inbounds  []inboundView
	Outbounds []outboundView
	Proxy     []targetConf
	WhatIf    *whatIf
	Ports     []int
}

type inboundView struct {
	Port     int
	Tags     map[string]string
	MTP      []mtpRow
	Policies []inboundType
}

type mtpRow struct {
	Subset, Action, Class, Origin string
}

type inboundType struct {
	Type  string
	Rules []ruleView
}

type ruleView struct {
	Subset, Conf, Origin string
}

type outboundView struct {
	Port     int
	Service  string
	Policies []targetConf
}

type whatIf struct {
	Inbound  int
	Client   string
	Error    string
	Decision string
	Class    string
	Types    []targetConf
}

func originNames(ms []policy.Origin) string {
	names := make([]string, 0, len(ms))
	for _, o := range ms {
		m := metaOf(o.Meta)
		n := m.Ref()
		if p := m.Provenance(); p != "" {
			n += " [" + p + "]"
		}
		names = append(names, n)
	}
	return strings.Join(names, ", ")
}

// dataplanePage renders one proxy (see the package doc of zone pages).
func (c *Console) dataplanePage(w http.ResponseWriter, r *http.Request) {
	mesh, name, ns := r.PathValue("mesh"), r.PathValue("name"), r.URL.Query().Get("namespace")
	var d dataplaneData
	if err := c.get(r, dpPath(mesh, name, ns, "", nil), &d.DP); err != nil {
		c.fail(w, r, "Dataplane "+name, err)
		return
	}
	if err := c.get(r, dpPath(mesh, name, ns, "_config", nil), &d.Config); err != nil {
		c.fail(w, r, "Dataplane "+name, err)
		return
	}
	for _, in := range d.Config.Inbounds {
		d.Ports = append(d.Ports, in.Port)
		d.Inbounds = append(d.Inbounds, inboundOf(in))
	}
	for _, out := range d.Config.Outbounds {
		ov := outboundView{Port: out.Port, Service: out.Service}
		for _, t := range sortedTypes(out.Policies) {
			q := url.Values{"type": {t}, "outbound": {out.Service}}
			ov.Policies = append(ov.Policies, c.explained(r, mesh, name, ns, t, out.Policies[t].Conf, q))
		}
		d.Outbounds = append(d.Outbounds, ov)
	}
	for _, t := range sortedTypes(d.Config.Proxy) {
		q := url.Values{"type": {t}, "proxy": {"true"}}
		d.Proxy = append(d.Proxy, c.explained(r, mesh, name, ns, t, d.Config.Proxy[t].Conf, q))
	}
	if q := r.URL.Query(); q.Has("client") || q.Has("inbound") {
		d.WhatIf = c.whatIf(r, mesh, name, ns, q.Get("inbound"), q.Get("client"))
	}
	var v xds.View
	if err := c.get(r, dpPath(mesh, name, ns, "_xds", nil), &v); err == nil {
		d.XDS = &v
	}
	c.render(w, r, http.StatusOK, "dataplane", page{Title: "Dataplane " + d.DP.Ref(), Nav: "dataplanes", Data: d})
}

func sortedTypes[T any](m map[string]T) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func inboundOf(in policy.InboundConfig) inboundView {
	iv := inboundView{Port: in.Port, Tags: in.Tags}
	for _, t := range sortedTypes(in.Policies) {
		tc := in.Policies[t]
		if t == "MeshTrafficPermission" {
			for _, ru := range tc.Rules {
				words, class := ruleAction(ru)
				iv.MTP = append(iv.MTP, mtpRow{Subset: subsetWords(ru), Action: words, Class: class, Origin: originNames(ru.Origin)})
			}
			if len(tc.Rules) == 0 {
				iv.MTP = append(iv.MTP, mtpRow{Subset: "every client", Action: "denied (no MeshTrafficPermission allows)", Class: "deny"})
			}
			continue
		}
		it := inboundType{Type: t}
		for _, ru := range tc.Rules {
			it.Rules = append(it.Rules, ruleView{Subset: subsetWords(ru), Conf: prettyJSON(ru.Conf), Origin: originNames(ru.Origin)})
		}
		iv.Policies = append(iv.Policies, it)
	}
	return iv
}

// explained asks _explain for one target and type and lays its fields out.
func (c *Console) explained(r *http.Request, mesh, name, ns, typ string, conf json.RawMessage, q url.Values) targetConf {
	out := targetConf{Type: typ, Conf: prettyJSON(conf)}
	eq := url.Values{}
	for k, v := range q {
		eq[k] = v
	}
	out.Explain = "/gui" + dpPath(mesh, name, ns, "explain", eq)
	var ex policy.Explanation
	aq := url.Values{"limit": {"1"}} // the winners and how many lost: not megabytes of losers
	for k, v := range q {
		aq[k] = v
	}
	if err := c.get(r, dpPath(mesh, name, ns, "_explain", aq), &ex); err != nil {
		out.Err = err.Error()
		return out
	}
	for _, f := range ex.Fields {
		lost := len(f.Lost)
		if f.LostTotal > lost {
			lost = f.LostTotal
		}
		out.Fields = append(out.Fields, fieldRow{Path: f.Path, Value: compactJSON(f.Value), SetBy: describe(f.SetBy), Lost: lost})
	}
	return out
}

func compactJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// whatIf evaluates one client against one inbound: every inbound policy
// type's conf for it, the MeshTrafficPermission decision first, and each
// type's explanation.
func (c *Console) whatIf(r *http.Request, mesh, name, ns, inbound, client string) *whatIf {
	wi := &whatIf{Client: strings.TrimSpace(client)}
	port, err := strconv.Atoi(strings.TrimSpace(inbound))
	if err != nil || port <= 0 {
		wi.Error = "inbound: choose the inbound port the client calls"
		return wi
	}
	wi.Inbound = port
	q := url.Values{"inbound": {strconv.Itoa(port)}, "client": {normalizeClient(wi.Client)}}
	var ev policy.InboundEvaluation
	if err := c.get(r, dpPath(mesh, name, ns, "_evaluate", q), &ev); err != nil {
		wi.Error = err.Error()
		return wi
	}
	wi.Decision, wi.Class = "denied (no MeshTrafficPermission allows this client)", "deny"
	for _, t := range sortedTypes(ev.Policies) {
		tc := ev.Policies[t]
		if t == "MeshTrafficPermission" {
			var conf struct {
				Action string `json:"action"`
			}
			_ = json.Unmarshal(tc.Conf, &conf)
			wi.Decision, wi.Class = actionWords(conf.Action)
			if names := originNames(tc.Origin); names != "" {
				wi.Decision += " by " + names
			}
		}
		eq := url.Values{"type": {t}, "inbound": {strconv.Itoa(port)}, "client": {normalizeClient(wi.Client)}}
		wi.Types = append(wi.Types, c.explained(r, mesh, name, ns, t, tc.Conf, eq))
	}
	return wi
}

// normalizeClient accepts "k:v, k=v" and newlines; the API wants k:v,k:v.
func normalizeClient(s string) string {
	var parts []string
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == '\n' || r == ';' }) {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if k, v, ok := strings.Cut(f, "="); ok && !strings.Contains(k, ":") {
			f = strings.TrimSpace(k) + ":" + strings.TrimSpace(v)
		}
		parts = append(parts, f)
	}
	return strings.Join(parts, ",")
}

type explainData struct {
	DP    meta
	Query string
	Ex    policy.Explanation
	Limit int
}

// explainLimit bounds the contributions the explain page lists (each field's
// losers, and the blocks); the page says how many more there are and the
// API gives them all.
const explainLimit = 100

// explainPage shows the whole explanation of one target and type: every
// field with its setter, each losing contribution with its reason, and
// every block's outcome.
func (c *Console) explainPage(w http.ResponseWriter, r *http.Request) {
	mesh, name, ns := r.PathValue("mesh"), r.PathValue("name"), r.URL.Query().Get("namespace")
	q := url.Values{}
	for _, k := range []string{"type", "outbound", "inbound", "client", "proxy"} {
		if v := r.URL.Query().Get(k); v != "" {
			q.Set(k, v)
		}
	}
	d := explainData{Query: q.Encode(), Limit: explainLimit}
	aq := url.Values{"limit": {strconv.Itoa(explainLimit)}}
	for k, v := range q {
		aq[k] = v
	}
	if err := c.get(r, dpPath(mesh, name, ns, "_explain", aq), &d.Ex); err != nil {
		c.fail(w, r, "Explanation", err)
		return
	}
	d.DP = meta{Mesh: mesh, Name: name, Namespace: ns}
	c.render(w, r, http.StatusOK, "explain", page{Title: d.Ex.Type + " on " + d.DP.Ref(), Nav: "dataplanes", Data: d})
}
