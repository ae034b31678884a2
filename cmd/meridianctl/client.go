package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// client talks to one control plane's REST API.
type client struct {
	base  *url.URL
	http  *http.Client
	token string
}

func newClient(address, token, caFile string) (*client, error) {
	if !strings.Contains(address, "://") {
		address = "http://" + address
	}
	u, err := url.Parse(address)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("--api-address %q: want http://HOST:PORT", address)
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	if caFile != "" {
		tlsCfg, err := auth.ClientTLS(auth.ClientTLSConfig{CAFile: caFile})
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		hc.Transport = &http.Transport{TLSClientConfig: tlsCfg, Proxy: http.ProxyFromEnvironment}
	}
	return &client{base: u, http: hc, token: token}, nil
}

// apiError is the server's error body.
type apiError struct {
	Status  int                   `json:"-"`
	Title   string                `json:"title"`
	Details string                `json:"details"`
	Causes  []resource.FieldError `json:"causes"`
}

func (e *apiError) Error() string {
	s := e.Details
	if s == "" {
		s = e.Title
	}
	for _, c := range e.Causes {
		s += fmt.Sprintf("\n  %s: %s", c.Field, c.Message)
	}
	return s
}

// do sends a request and returns the body of a 2xx response, or *apiError.
func (c *client) do(ctx context.Context, method, path string, query url.Values, body []byte, accept string) ([]byte, http.Header, error) {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		rd = strings.NewReader(string(body))
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, nil, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, u.Path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: read response: %w", method, u.Path, err)
	}
	if resp.StatusCode >= 300 {
		e := &apiError{Status: resp.StatusCode}
		if json.Unmarshal(data, e) != nil || (e.Title == "" && e.Details == "") {
			e.Details = fmt.Sprintf("%s %s: %s: %s", method, u.Path, resp.Status, strings.TrimSpace(string(data)))
		}
		return nil, resp.Header, e
	}
	return data, resp.Header, nil
}

// resourcePath is the API path of one resource or, with name "", its list.
func resourcePath(d *resource.TypeDescriptor, mesh, name string) string {
	var p string
	switch {
	case d.Name == "Mesh":
		p = "/meshes"
		mesh = ""
	case d.Scope == resource.ScopeGlobal:
		p = "/" + d.Plural
	default:
		p = "/meshes/" + url.PathEscape(mesh) + "/" + d.Plural
	}
	if name != "" {
		p += "/" + url.PathEscape(name)
	}
	return p
}
