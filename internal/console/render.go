package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/meridian-mesh/meridian/internal/kds"
)

// page is what the layout needs around a page's own data.
type page struct {
	Title  string
	Mode   string
	Zone   string
	Nav    string // the nav entry to mark current
	User   principal
	Live   bool
	Data   any
	Notice string
}

func (c *Console) parseTemplates() error {
	funcs := template.FuncMap{
		"ago":      c.ago,
		"describe": describe,
		"pretty":   prettyJSON,
		"join":     strings.Join,
		"pathesc":  url.PathEscape,
		"queryesc": url.QueryEscape,
		"lower":    strings.ToLower,
		"sub":      func(a, b int) int { return a - b },
		"inc":      func(i int) int { return i + 1 },
		"add":      func(a, b int) int { return a + b },
		"flowOf": func(name string, f kds.FlowStatus) map[string]any {
			return map[string]any{"Name": name, "Flow": f}
		},
		"sortedKeys": func(m map[string]string) []string {
			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			return keys
		},
	}
	layout, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return fmt.Errorf("console: layout: %w", err)
	}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return err
	}
	c.pages = map[string]*template.Template{}
	for _, n := range names {
		base := path.Base(n)
		if base == "layout.html" {
			continue
		}
		t, err := template.Must(layout.Clone()).ParseFS(templateFS, n)
		if err != nil {
			return fmt.Errorf("console: %s: %w", base, err)
		}
		c.pages[strings.TrimSuffix(base, ".html")] = t
	}
	return nil
}

// render writes a whole page, or only its main section when the page's
// script asks for a live refresh (X-Meridian-Fragment).
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	t, ok := c.pages[name]
	if !ok {
		http.Error(w, "no template "+name, http.StatusInternalServerError)
		return
	}
	p.Mode, p.Zone, p.User, p.Live = string(c.cfg.Plane.Mode), c.cfg.Plane.Zone, principalOf(r), c.cfg.Changes != nil
	root := "layout"
	if r.Header.Get("X-Meridian-Fragment") == "1" {
		root = "main"
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, root, p); err != nil {
		c.cfg.Logger.Error("console page failed", "page", name, "error", err)
		http.Error(w, "page failed: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail shows an error page with the API's status (404 stays 404).
func (c *Console) fail(w http.ResponseWriter, r *http.Request, title string, err error) {
	status := http.StatusInternalServerError
	var ae *apiError
	if errors.As(err, &ae) {
		status = ae.Status
	}
	c.render(w, r, status, "error", page{Title: title, Data: err.Error()})
}

func (c *Console) ago(v any) string {
	var t time.Time
	switch x := v.(type) {
	case time.Time:
		t = x
	case *time.Time:
		if x == nil {
			return "never"
		}
		t = *x
	case string:
		p, err := time.Parse(time.RFC3339Nano, x)
		if err != nil {
			return x
		}
		t = p
	default:
		return ""
	}
	if t.IsZero() {
		return "never"
	}
	d := c.cfg.Now().Sub(t)
	switch {
	case d < 0:
		return t.UTC().Format(time.RFC3339)
	case d < 2*time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return t.UTC().Format("2006-01-02 15:04 UTC")
}

func prettyJSON(v any) string {
	if raw, ok := v.(json.RawMessage); ok {
		var x any
		if json.Unmarshal(raw, &x) != nil {
			return string(raw)
		}
		v = x
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
