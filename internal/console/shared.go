package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// pageSize bounds every table: first paint stays fast with 10,000 policies.
const pageSize = 50

type meshItem struct {
	stored
	MTLS *struct {
		EnabledBackend string `json:"enabledBackend"`
	} `json:"mtls"`
}

func (c *Console) meshesPage(w http.ResponseWriter, r *http.Request) {
	var meshes api.List[meshItem]
	if err := c.get(r, "/meshes", &meshes); err != nil {
		c.fail(w, r, "Meshes", err)
		return
	}
	c.render(w, r, http.StatusOK, "meshes", page{Title: "Meshes", Nav: "meshes", Data: meshes.Items})
}

// meshNames lists the meshes the user may see, sorted.
func (c *Console) meshNames(r *http.Request) ([]string, error) {
	var meshes api.List[stored]
	if err := c.get(r, "/meshes", &meshes); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(meshes.Items))
	for _, m := range meshes.Items {
		names = append(names, m.Name)
	}
	slices.Sort(names)
	return names, nil
}

// meshChoice is the meshes the user may see and the one the page shows.
func (c *Console) meshChoice(r *http.Request) ([]string, string, error) {
	meshes, err := c.meshNames(r)
	if err != nil {
		return nil, "", err
	}
	return meshes, pickMesh(r, meshes), nil
}

// pickMesh is the ?mesh= asked for, else "default", else the first.
func pickMesh(r *http.Request, meshes []string) string {
	if m := r.URL.Query().Get("mesh"); m != "" {
		return m
	}
	if slices.Contains(meshes, "default") || len(meshes) == 0 {
		return "default"
	}
	return meshes[0]
}

type policiesData struct {
	Meshes []string
	Mesh   string
	Types  []string
	Type   string
	Plural string
	Origin string
	Items  []stored
	Total  int
	Pager  pager
	IsZone bool
}

// pager links the pages of a table.
type pager struct {
	Offset, Size, Total int
	Prev, Next          string
}

func newPager(r *http.Request, total, size int) pager {
	off, _ := strconv.Atoi(r.URL.Query().Get("offset"))
	off = max(0, min(off, total))
	p := pager{Offset: off, Size: size, Total: total}
	link := func(o int) string {
		q := r.URL.Query()
		q.Set("offset", strconv.Itoa(o))
		return r.URL.Path + "?" + q.Encode()
	}
	if off > 0 {
		p.Prev = link(max(0, off-size))
	}
	if off+size < total {
		p.Next = link(off + size)
	}
	return p
}

// policyTypes are the registry's policy types, sorted.
func (c *Console) policyTypes() []string {
	var out []string
	for _, n := range c.cfg.Registry.Names() {
		if d, ok := c.cfg.Registry.Lookup(n); ok && d.IsPolicy() && d.Scope == resource.ScopeMesh {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// policiesPage lists one policy type of one mesh, filtered by origin
// (global, zone or any), with each policy's status: per zone on the global
// (Synced conditions), Accepted/Enforced on a zone.
func (c *Console) policiesPage(w http.ResponseWriter, r *http.Request) {
	meshes, mesh, err := c.meshChoice(r)
	if err != nil {
		c.fail(w, r, "Policies", err)
		return
	}
	q := r.URL.Query()
	d := policiesData{Meshes: meshes, Mesh: mesh, Types: c.policyTypes(), Type: q.Get("type"), Origin: q.Get("origin"), IsZone: !c.global()}
	if d.Type == "" {
		d.Type = "MeshTrafficPermission"
	}
	desc, ok := c.cfg.Registry.Lookup(d.Type)
	if !ok {
		c.fail(w, r, "Policies", &apiError{Status: http.StatusNotFound, Title: "Not Found", Details: fmt.Sprintf("no policy type %q", d.Type)})
		return
	}
	d.Plural = desc.Plural
	path := "/meshes/" + url.PathEscape(d.Mesh) + "/" + desc.Plural
	offset, _ := strconv.Atoi(q.Get("offset"))
	var items api.List[stored]
	if err := c.get(r, path+"?"+listQuery(d.Origin, max(0, offset)), &items); err != nil {
		c.fail(w, r, "Policies", err)
		return
	}
	d.Items, d.Total, d.Pager = items.Items, items.Total, newPager(r, items.Total, pageSize)
	c.render(w, r, http.StatusOK, "policies", page{Title: d.Type + " in " + d.Mesh, Nav: "policies", Data: d})
}

// listQuery is the API list query: a page, and the origin label filter.
func listQuery(origin string, offset int) string {
	v := url.Values{}
	v.Set("offset", strconv.Itoa(offset))
	v.Set("size", strconv.Itoa(pageSize))
	if origin == "global" || origin == "zone" {
		v.Set("labels", "kuma.io/origin="+origin)
	}
	return v.Encode()
}

type resourceData struct {
	Res        stored
	Plural     string
	Doc        string
	Dataplanes []meta
	DPTotal    int
	IsPolicy   bool
	IsZone     bool
	Zones      []condition
}

// resourcePage shows one resource: its document, its conditions (Synced per
// zone on the global; Accepted and Enforced on a zone) and, on a zone, the
// Dataplanes a policy selects.
func (c *Console) resourcePage(w http.ResponseWriter, r *http.Request) {
	mesh, plural, name := r.PathValue("mesh"), r.PathValue("plural"), r.PathValue("name")
	desc, ok := c.cfg.Registry.LookupPlural(plural)
	if !ok {
		c.fail(w, r, name, &apiError{Status: http.StatusNotFound, Title: "Not Found", Details: fmt.Sprintf("no resource type %q", plural)})
		return
	}
	if plural == "dataplanes" && !c.global() {
		c.dataplanePage(w, r)
		return
	}
	ns := r.URL.Query().Get("namespace")
	path := "/meshes/" + url.PathEscape(mesh) + "/" + plural + "/" + url.PathEscape(name)
	if ns != "" {
		path += "?namespace=" + url.QueryEscape(ns)
	}
	d := resourceData{Plural: plural, IsPolicy: desc.IsPolicy(), IsZone: !c.global()}
	var raw json.RawMessage
	if err := c.get(r, path, &raw); err != nil {
		c.fail(w, r, name, err)
		return
	}
	if err := json.Unmarshal(raw, &d.Res); err != nil {
		c.fail(w, r, name, err)
		return
	}
	d.Doc = prettyJSON(raw)
	if d.IsPolicy && !c.global() {
		sel := "/meshes/" + url.PathEscape(mesh) + "/" + plural + "/" + url.PathEscape(name) + "/_resources/dataplanes?size=" + strconv.Itoa(pageSize)
		if ns != "" {
			sel += "&namespace=" + url.QueryEscape(ns)
		}
		var dps api.List[meta]
		if err := c.get(r, sel, &dps); err == nil {
			d.Dataplanes, d.DPTotal = dps.Items, dps.Total
		}
	}
	for _, cond := range d.Res.Status.Conditions {
		if strings.HasPrefix(cond.Type, "Synced") || cond.Type == "Synced" {
			d.Zones = append(d.Zones, cond)
		}
	}
	c.render(w, r, http.StatusOK, "resource", page{Title: desc.Name + " " + d.Res.Ref(), Nav: "policies", Data: d})
}
